// NVML, the NVIDIA driver's management library, beside the virtual GPUs: how much memory the
// physical card holds and how busy it is, as nvidia-smi reports them.
//
// libnvidia-ml.so.1 ships with the driver, not with CUDA or LibTorch, so meshsim opens it at
// run time (dlopen) and declares the few NVML types and functions it calls itself: no NVIDIA
// header, no link-time dependency, and a build that runs the same on a machine without a
// driver. Every failure (no library, a driver too old, a call NVML refuses) is a one-line
// reason, never an exception, a crash or a hang.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace meshsim {

/// One reading of a physical card.
struct NvmlSample {
  /// Memory in use on the card, by every process, as nvmlDeviceGetMemoryInfo reports it: this
  /// includes what the driver reserves for itself, which nvidia-smi leaves out (480 MiB on an
  /// idle H100 with driver 580.159, where nvidia-smi shows 0 MiB).
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
  /// Percent of the last sample period (1/6 s to 1 s, by card) during which a kernel ran;
  /// absent where NVML does not report it (for example a MIG instance).
  std::optional<int> util_pct;
};

/// An open NVML. Every call holds one mutex, so any rank thread may sample while another
/// prints; NVML itself is initialised once per object (NVML counts its initialisations).
class Nvml {
public:
  /// "libnvidia-ml.so.1", or $MESHSIM_NVML_LIB when set (a test points it at a missing file).
  static std::string default_library();

  /// The process's NVML, opened from default_library() on first use and kept open to the end
  /// of the process (never shut down, so a rank thread still sampling at exit is safe).
  static Nvml& instance();

  /// Opens `library` and initialises NVML; available() says whether it worked.
  explicit Nvml(const std::string& library);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return available_; }
  /// Why NVML is not available, one line, such as
  /// "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver)"; empty when it is.
  const std::string& reason() const { return reason_; }

  /// Each query returns nothing (and sets *error, one line, when given) if NVML is not
  /// available or refuses the call; `index` is NVML's device index.
  std::optional<int> device_count(std::string* error = nullptr);
  std::optional<std::string> name(int index, std::string* error = nullptr);
  std::optional<std::string> driver_version(std::string* error = nullptr);
  std::optional<NvmlSample> sample(int index, std::string* error = nullptr);

private:
  struct Api; // the NVML entry points, looked up with dlsym
  /// Under the lock, `ask(api, err)` when NVML is available, else nothing with the reason;
  /// `err` is *error, or a scratch string when the caller wants no reason.
  template <typename T, typename Ask> std::optional<T> query(std::string* error, Ask ask);
  std::mutex mutex_;
  std::unique_ptr<Api> api_;
  bool available_ = false;
  std::string reason_;
};

/// NVML's index for the CUDA device `device` ("cuda" or "cuda:N"), or nothing with *reason.
/// CUDA numbers only the devices in `cuda_visible_devices` ($CUDA_VISIBLE_DEVICES; null when
/// unset), so cuda:N is the N-th of that list. Entries that are UUIDs or MIG instances are not
/// resolved: the answer is then nothing, never another card's numbers. NVML numbers cards in PCI
/// bus order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID (its default order, fastest first,
/// is the same on a machine whose cards are all alike).
std::optional<int> nvml_index_of_cuda_device(const std::string& device,
                                             const char* cuda_visible_devices, std::string* reason);

} // namespace meshsim
