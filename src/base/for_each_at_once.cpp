// Independent iterations on several threads.
#include "base/for_each_at_once.h"

#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace meshsim {

void for_each_at_once(size_t n, int workers, const std::function<void(size_t)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers && static_cast<size_t>(w) < n; ++w)
    threads.emplace_back(work);
  work();
  for (std::thread& t : threads)
    t.join();
  for (const std::exception_ptr& e : errors)
    if (e)
      std::rethrow_exception(e);
}

} // namespace meshsim
