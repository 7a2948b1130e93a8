/* A stand-in for libnvidia-ml.so.1 with two cards, so tests can exercise meshsim's NVML path
 * on machines without an NVIDIA driver. The declarations follow nvml.h; return codes are
 * NVML's own (0 success, 1 uninitialized, 2 invalid argument, 3 not supported, 9 driver not
 * loaded). Built by the tests with the system C compiler (fake_nvml.h):
 *   -DFAKE_NVML_INIT_FAILS          nvmlInit_v2 answers "Driver Not Loaded"
 *   -DFAKE_NVML_NO_UTILIZATION      the library has no nvmlDeviceGetUtilizationRates
 */
#include <stdio.h>

typedef struct nvmlDevice_st {
  int index;
} * nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;

static struct nvmlDevice_st devices[2] = {{0}, {1}};
static int initialised;

int nvmlInit_v2(void) {
#ifdef FAKE_NVML_INIT_FAILS
  return 9;
#else
  ++initialised;
  return 0;
#endif
}

int nvmlShutdown(void) {
  if (initialised == 0)
    return 1;
  --initialised;
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (initialised == 0)
    return 1;
  *count = 2;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (initialised == 0)
    return 1;
  if (index >= 2)
    return 2;
  *device = &devices[index];
  return 0;
}

int nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  snprintf(name, length, "Fake GPU %d", device->index);
  return 0;
}

/* Card 0: 1.5 GiB of 80 GiB used; card 1: 3 GiB. */
int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  memory->total = 80ULL << 30;
  memory->used = (device->index + 1) * (1536ULL << 20);
  memory->free = memory->total - memory->used;
  return 0;
}

#ifndef FAKE_NVML_NO_UTILIZATION
/* Card 0 is 42% busy; card 1 does not report it, as a MIG instance does not. */
int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  if (device->index == 1)
    return 3;
  utilization->gpu = 42;
  utilization->memory = 7;
  return 0;
}
#endif

int nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  snprintf(version, length, "555.42.06");
  return 0;
}

const char* nvmlErrorString(int result) {
  switch (result) {
  case 0:
    return "Success";
  case 1:
    return "Uninitialized";
  case 2:
    return "Invalid Argument";
  case 3:
    return "Not Supported";
  case 9:
    return "Driver Not Loaded";
  }
  return "Unknown Error";
}
