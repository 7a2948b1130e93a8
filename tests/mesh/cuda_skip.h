// CUDA tests run where LibTorch has CUDA and a card is present; elsewhere they skip, saying why.
#pragma once

#include <gtest/gtest.h>

#include "device/physical_device.h"

#define MESHSIM_REQUIRE_CUDA()                                 \
  do {                                                         \
    const meshsim::CudaStatus card_ = meshsim::cuda_status(); \
    if (!card_.usable)                                         \
      GTEST_SKIP() << card_.reason;                            \
  } while (0)
