// Whether /usr/bin/python3 can import torch (Debian's python3-torch), the reference the
// PyTorch comparisons run; those tests skip with that reason where it cannot.
#pragma once

#include <cstdlib>

namespace meshsim::testing {

inline bool python_torch_available() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

} // namespace meshsim::testing
