#pragma once
// run_thread_ranks(world, fn): fn(rank, group) on `world` threads joined by one
// ThreadProcessGroup; after every thread has ended, the first rank's exception (if any) is
// rethrown on the calling thread (Catch2's assertions are not thread-safe: rank threads record
// numbers or throw, the test thread checks).
#include <exception>
#include <thread>
#include <vector>

#include "ember/dist/thread_group.hpp"

namespace ember::testing {

template <class Fn>
void run_thread_ranks(int world, Fn fn) {
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r, *groups[static_cast<size_t>(r)]);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ember::testing
