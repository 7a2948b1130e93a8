// NVML loaded with dlopen: the declarations below are the subset of nvml.h (NVIDIA's NVML API
// reference) that meshsim calls, with the same names, layouts and calling conventions. Checked
// against a real driver (580.159.04, H100: every query, utilisation under load); the tests run
// it against tests/device/fake_nvml.c.
#include "device/nvml.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <type_traits>
#include <vector>

namespace meshsim {
// NVML's C types as nvml.h declares them (the header is not needed to build). Outside the
// anonymous namespace: Nvml::Api's fields have these types, and Nvml::Api is not internal.
namespace nvml_abi {
using nvmlReturn_t = int; // an enum in nvml.h; NVML_SUCCESS is 0
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
} // namespace nvml_abi

namespace {

using nvml_abi::nvmlDevice_t;
using nvml_abi::nvmlMemory_t;
using nvml_abi::nvmlReturn_t;
using nvml_abi::nvmlUtilization_t;
constexpr nvmlReturn_t kNvmlSuccess = 0;
// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE.
constexpr unsigned int kNameBufferSize = 96;
constexpr unsigned int kDriverVersionBufferSize = 80;

constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r')
      c = ' ';
  return s;
}

/// 0 to 9999, digits only: a device index std::stoi reads without throwing.
bool small_index(const std::string& s) {
  return !s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos;
}

} // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*get_count)(unsigned int*);
  nvmlReturn_t (*get_handle)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*get_utilization)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*get_driver_version)(char*, unsigned int);
  const char* (*error_string)(nvmlReturn_t);

  /// "nvmlDeviceGetMemoryInfo: Not Supported"
  std::string error(const char* call, nvmlReturn_t rc) const {
    const char* text = error_string(rc);
    return std::string(call) + ": " + (text ? one_line(text) : "error " + std::to_string(rc));
  }

  /// The handle of device `index`, or null with *err.
  nvmlDevice_t device(int index, std::string& err) const {
    nvmlDevice_t handle = nullptr;
    if (index < 0) {
      err = "no NVML device " + std::to_string(index);
      return nullptr;
    }
    if (const nvmlReturn_t rc = get_handle(static_cast<unsigned int>(index), &handle);
        rc != kNvmlSuccess) {
      err = error("nvmlDeviceGetHandleByIndex_v2", rc);
      return nullptr;
    }
    return handle;
  }
};

std::string Nvml::default_library() {
  const char* env = std::getenv("MESHSIM_NVML_LIB");
  return (env != nullptr && *env != '\0') ? env : kDefaultLibrary;
}

Nvml& Nvml::instance() {
  static Nvml* nvml = new Nvml(default_library()); // never destroyed: see the header
  return *nvml;
}

Nvml::Nvml(const std::string& library) {
  const std::string prefix = "NVML not available: ";
  // The handle is never closed: the driver's library may leave exit handlers behind, and a
  // mapped library costs nothing.
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    const std::string detail = error ? one_line(error) : "";
    if (detail.find("No such file") != std::string::npos)
      reason_ = prefix + library + " not found" +
                (library == kDefaultLibrary ? " (no NVIDIA driver)" : "");
    else
      reason_ = prefix + "cannot load " + library + ": " + detail;
    return;
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, symbol));
    if (fn == nullptr && missing.empty())
      missing = symbol;
  };
  bind(api->init, "nvmlInit_v2");
  bind(api->shutdown, "nvmlShutdown");
  bind(api->get_count, "nvmlDeviceGetCount_v2");
  bind(api->get_handle, "nvmlDeviceGetHandleByIndex_v2");
  bind(api->get_name, "nvmlDeviceGetName");
  bind(api->get_memory, "nvmlDeviceGetMemoryInfo");
  bind(api->get_utilization, "nvmlDeviceGetUtilizationRates");
  bind(api->get_driver_version, "nvmlSystemGetDriverVersion");
  bind(api->error_string, "nvmlErrorString");
  if (!missing.empty()) {
    reason_ = prefix + library + " has no " + missing;
    return;
  }
  const nvmlReturn_t rc = api->init();
  if (rc != kNvmlSuccess) {
    reason_ = prefix + api->error("nvmlInit_v2", rc);
    return;
  }
  api_ = std::move(api);
  available_ = true;
}

Nvml::~Nvml() {
  if (available_)
    api_->shutdown();
}

template <typename T, typename Ask> std::optional<T> Nvml::query(std::string* error, Ask ask) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string ignored;
  std::string& err = error ? *error : ignored;
  if (!available_) {
    err = reason_;
    return std::nullopt;
  }
  return ask(*api_, err);
}

std::optional<int> Nvml::device_count(std::string* error) {
  return query<int>(error, [](Api& api, std::string& err) -> std::optional<int> {
    unsigned int count = 0;
    if (const nvmlReturn_t rc = api.get_count(&count); rc != kNvmlSuccess) {
      err = api.error("nvmlDeviceGetCount_v2", rc);
      return std::nullopt;
    }
    return static_cast<int>(count);
  });
}

std::optional<std::string> Nvml::driver_version(std::string* error) {
  return query<std::string>(error, [](Api& api, std::string& err) -> std::optional<std::string> {
    char buf[kDriverVersionBufferSize] = {};
    if (const nvmlReturn_t rc = api.get_driver_version(buf, sizeof(buf)); rc != kNvmlSuccess) {
      err = api.error("nvmlSystemGetDriverVersion", rc);
      return std::nullopt;
    }
    buf[sizeof(buf) - 1] = '\0';
    return std::string(buf);
  });
}

std::optional<std::string> Nvml::name(int index, std::string* error) {
  return query<std::string>(error, [index](Api& api, std::string& err) -> std::optional<std::string> {
    const nvmlDevice_t device = api.device(index, err);
    if (device == nullptr)
      return std::nullopt;
    char buf[kNameBufferSize] = {};
    if (const nvmlReturn_t rc = api.get_name(device, buf, sizeof(buf)); rc != kNvmlSuccess) {
      err = api.error("nvmlDeviceGetName", rc);
      return std::nullopt;
    }
    buf[sizeof(buf) - 1] = '\0';
    return std::string(buf);
  });
}

std::optional<NvmlSample> Nvml::sample(int index, std::string* error) {
  return query<NvmlSample>(error, [index](Api& api, std::string& err) -> std::optional<NvmlSample> {
    const nvmlDevice_t device = api.device(index, err);
    if (device == nullptr)
      return std::nullopt;
    nvmlMemory_t memory{};
    if (const nvmlReturn_t rc = api.get_memory(device, &memory); rc != kNvmlSuccess) {
      err = api.error("nvmlDeviceGetMemoryInfo", rc);
      return std::nullopt;
    }
    NvmlSample s;
    s.used_bytes = static_cast<int64_t>(memory.used);
    s.total_bytes = static_cast<int64_t>(memory.total);
    // Utilisation is optional: NVML reports memory but not utilisation for MIG instances.
    nvmlUtilization_t util{};
    if (api.get_utilization(device, &util) == kNvmlSuccess)
      s.util_pct = static_cast<int>(util.gpu);
    return s;
  });
}

std::optional<int> nvml_index_of_cuda_device(const std::string& device,
                                             const char* cuda_visible_devices,
                                             std::string* reason) {
  std::string ignored;
  std::string& why = reason ? *reason : ignored;
  if (device.rfind("cuda", 0) != 0) {
    why = device + " is not a CUDA device";
    return std::nullopt;
  }
  int ordinal = 0;
  if (device != "cuda") {
    if (device[4] != ':' || !small_index(device.substr(5))) {
      why = "cannot read a device index in " + device;
      return std::nullopt;
    }
    ordinal = std::stoi(device.substr(5));
  }
  if (cuda_visible_devices == nullptr)
    return ordinal;
  // CUDA reads the list up to its first invalid entry; meshsim resolves only plain indices.
  std::vector<std::string> entries(1);
  for (const char* c = cuda_visible_devices; *c != '\0'; ++c) {
    if (*c == ',')
      entries.emplace_back();
    else if (!std::isspace(static_cast<unsigned char>(*c)))
      entries.back() += *c;
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].empty()) {
      entries.resize(i); // an empty entry ends the list, and an empty list hides every card
      break;
    }
  }
  if (ordinal >= static_cast<int>(entries.size())) {
    why = device + " is not in CUDA_VISIBLE_DEVICES=" + cuda_visible_devices;
    return std::nullopt;
  }
  const std::string& entry = entries[ordinal];
  if (!small_index(entry)) {
    why = "cannot tell which card " + device + " is: CUDA_VISIBLE_DEVICES=" + cuda_visible_devices +
          " names it " + entry + ", not by index";
    return std::nullopt;
  }
  return std::stoi(entry);
}

} // namespace meshsim
