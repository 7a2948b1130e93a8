// The physical device under the virtual GPUs: the CPU, or one CUDA card carved into N.
//
// Everything here compiles with or without CUDA. Without it (LibTorch 1.13 from Debian, or any
// CPU-only LibTorch) `cuda_status()` says why CUDA cannot be used and the types below are
// inert; nothing in this header names a CUDA type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace meshsim {

/// Whether this build of meshsim has the CUDA path (LibTorch with CUDA found at configure).
bool cuda_built();

struct CudaStatus {
  bool usable = false;
  std::string reason;      // why not, in one line, when !usable
  std::string name;        // "NVIDIA H100 80GB HBM3"
  int64_t total_bytes = 0; // the card's memory
  int64_t free_bytes = 0;  // free now (cudaMemGetInfo)
  int capability_major = 0, capability_minor = 0;
  int multiprocessors = 0;
};

/// The first CUDA device as LibTorch sees it (device 0; meshsim uses one card).
CudaStatus cuda_status();

/// "cpu", "cuda" or "meta" from a --device value ("auto": cuda when a usable GPU is present).
std::string resolve_device(const std::string& requested);

/// One virtual GPU's CUDA stream. Created on the card for a CUDA mesh; inert on the CPU.
class RankStream {
public:
  /// A stream of its own on cuda:0 (never the default stream).
  static RankStream create();
  RankStream() = default;

  bool valid() const { return handle_ != nullptr; }
  /// The cudaStream_t, as an opaque handle (for allocator routing and kernel launches).
  void* handle() const { return handle_; }
  /// Waits on the host until everything queued on the stream has run.
  void synchronize() const;

private:
  void* handle_ = nullptr;
};

/// Makes a rank's thread use its virtual GPU's device for the scope's lifetime: on CUDA,
/// cuda:0 with the rank's stream as the current stream, and autograd's backward run on this
/// thread (not on autograd's one shared device thread), so a rank's backward allocates,
/// launches and communicates on the rank's own thread and stream.
class RankDeviceScope {
public:
  explicit RankDeviceScope(const RankStream& stream);
  ~RankDeviceScope();
  RankDeviceScope(const RankDeviceScope&) = delete;
  RankDeviceScope& operator=(const RankDeviceScope&) = delete;

private:
  struct State;
  std::unique_ptr<State> state_;
};

/// A CUDA event: recorded on the calling thread's current stream, waited on by another
/// stream, so work on different virtual GPUs is ordered on the card without the host. Made
/// on the card only when first recorded, so an unused one costs nothing; waiting on one never
/// recorded waits for nothing.
class DeviceEvent {
public:
  DeviceEvent();
  ~DeviceEvent();
  DeviceEvent(DeviceEvent&&) noexcept;
  DeviceEvent& operator=(DeviceEvent&&) noexcept;

  /// Records the event on the current stream.
  void record();
  /// Makes the current stream wait for the event (no host wait).
  void block_current_stream() const;

private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The current CUDA stream of the calling thread (opaque cudaStream_t), or null without CUDA.
void* current_stream_handle();

/// Tells the caching allocator that `t`'s memory is in use by work queued on the current
/// stream, so it is not handed out again before that work has run (record_stream). A no-op
/// for tensors off the card.
void hold_for_current_stream(const at::Tensor& t);

} // namespace meshsim
