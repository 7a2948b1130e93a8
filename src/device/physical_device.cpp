// The physical device: CUDA when this build has it (MESHSIM_CUDA), inert stand-ins otherwise.
#include "device/physical_device.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <mutex>

#include <fmt/format.h>

#if MESHSIM_CUDA
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/AutogradState.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace meshsim {

bool cuda_built() {
#if MESHSIM_CUDA
  return true;
#else
  return false;
#endif
}

CudaStatus cuda_status() {
  CudaStatus s;
#if MESHSIM_CUDA
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    s.reason = fmt::format("no usable CUDA device: {}", cudaGetErrorString(e));
    cudaGetLastError(); // clear it, so LibTorch does not report it later
    return s;
  }
  if (count == 0 || !torch::cuda::is_available()) {
    s.reason = "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)";
    return s;
  }
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(0);
  s.name = p->name;
  s.capability_major = p->major;
  s.capability_minor = p->minor;
  s.multiprocessors = p->multiProcessorCount;
  size_t free = 0, total = 0;
  c10::cuda::CUDAGuard guard(0);
  if (const cudaError_t e = cudaMemGetInfo(&free, &total); e != cudaSuccess) {
    s.reason = fmt::format("cannot read the memory of {}: {}", s.name, cudaGetErrorString(e));
    return s;
  }
  s.free_bytes = static_cast<int64_t>(free);
  s.total_bytes = static_cast<int64_t>(total);
  s.usable = true;
#else
  s.reason = fmt::format("this meshsim was built against LibTorch {}.{} without CUDA (build it "
                         "against a CUDA LibTorch: docs/cuda.md)",
                         TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR);
#endif
  return s;
}

std::string resolve_device(const std::string& requested) {
  if (requested == "auto")
    return cuda_status().usable ? "cuda" : "cpu";
  if (requested == "cuda:0")
    return "cuda";
  return requested;
}

#if MESHSIM_CUDA

namespace {
c10::cuda::CUDAStream as_stream(void* handle) {
  return c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(handle), 0);
}
} // namespace

RankStream RankStream::create() {
  // float32 means IEEE float32 on the card as on the CPU: no TF32 in matmuls or convolutions
  // (cuDNN's default allows it), so a CUDA run can be held against the CPU run.
  static std::once_flag ieee;
  std::call_once(ieee, [] {
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  });
  c10::cuda::CUDAGuard guard(0);
  cudaStream_t s = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  RankStream r; // lives as long as the process: tensors may still be queued on it at exit
  r.handle_ = s;
  return r;
}

void RankStream::synchronize() const {
  if (handle_)
    C10_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

struct RankDeviceScope::State {
  explicit State(void* handle) : guard(as_stream(handle)) {}
  c10::cuda::CUDAStreamGuard guard;
  bool multithreading = true;
};

RankDeviceScope::RankDeviceScope(const RankStream& stream) {
  if (!stream.valid())
    return;
  state_ = std::make_unique<State>(stream.handle());
  auto& autograd = c10::AutogradState::get_tls_state();
  state_->multithreading = autograd.get_multithreading_enabled();
  autograd.set_multithreading_enabled(false);
}

RankDeviceScope::~RankDeviceScope() {
  if (state_)
    c10::AutogradState::get_tls_state().set_multithreading_enabled(state_->multithreading);
}

struct DeviceEvent::State {
  at::cuda::CUDAEvent event;
};

DeviceEvent::DeviceEvent() = default;

void DeviceEvent::record() {
  if (!state_)
    state_ = std::make_unique<State>();
  state_->event.record(at::cuda::getCurrentCUDAStream());
}

void DeviceEvent::block_current_stream() const {
  if (state_)
    state_->event.block(at::cuda::getCurrentCUDAStream());
}

void* current_stream_handle() { return at::cuda::getCurrentCUDAStream().stream(); }

void hold_for_current_stream(const at::Tensor& t) {
  if (t.defined() && t.is_cuda())
    t.record_stream(at::cuda::getCurrentCUDAStream());
}

#else

RankStream RankStream::create() {
  throw std::runtime_error(cuda_status().reason);
}
void RankStream::synchronize() const {}

struct RankDeviceScope::State {};
RankDeviceScope::RankDeviceScope(const RankStream&) {}
RankDeviceScope::~RankDeviceScope() = default;

struct DeviceEvent::State {};
DeviceEvent::DeviceEvent() = default;
void DeviceEvent::record() {}
void DeviceEvent::block_current_stream() const {}

void* current_stream_handle() { return nullptr; }
void hold_for_current_stream(const at::Tensor&) {}

#endif

DeviceEvent::~DeviceEvent() = default;
DeviceEvent::DeviceEvent(DeviceEvent&&) noexcept = default;
DeviceEvent& DeviceEvent::operator=(DeviceEvent&&) noexcept = default;

} // namespace meshsim
