// A loop whose iterations are independent, run on several threads.
#pragma once

#include <cstddef>
#include <functional>

namespace meshsim {

/// fn(i) for every i < n, on `workers` threads at once (this one among them), each taking the
/// next i as it finishes one; an exception of any call is rethrown here, after all have ended
/// (the first in index order).
void for_each_at_once(size_t n, int workers, const std::function<void(size_t)>& fn);

} // namespace meshsim
