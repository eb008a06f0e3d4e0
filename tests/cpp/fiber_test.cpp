// Context switching between many fibers: values live in registers and on
// each fiber's stack across switches, and every fiber resumes where it left.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fiber.h"

namespace {

constexpr int kFibers = 64, kRounds = 200;

mtlsim::Context scheduler;
std::vector<mtlsim::Context> contexts(kFibers);
std::vector<double> results(kFibers);

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    std::exit(1);
  }
}

[[gnu::noinline]] double work(int id, int round, double acc) { return acc * 0.5 + id + round * 1e-3; }

void fiber(void* arg) {
  const int id = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  double acc = id;  // kept across switches in a callee-saved register or on this stack
  volatile char stack_marker[512];
  for (int k = 0; k < 512; ++k) stack_marker[k] = char(id + k);
  for (int round = 0; round < kRounds; ++round) {
    acc = work(id, round, acc);
    mtlsim::switch_context(contexts[id], scheduler);
  }
  for (int k = 0; k < 512; ++k) check(stack_marker[k] == char(id + k), "fiber stack preserved");
  results[id] = acc;
  mtlsim::switch_context(contexts[id], scheduler);
  std::abort();  // never resumed
}

}  // namespace

int main() {
  mtlsim::StackPool stacks(kFibers, 64 * 1024);
  for (int i = 0; i < kFibers; ++i)
    mtlsim::make_context(contexts[i], stacks.stack(i), stacks.stack_bytes(), fiber,
                         reinterpret_cast<void*>(intptr_t(i)));
  // Round-robin in reverse order, so no fiber runs in creation order.
  for (int round = 0; round <= kRounds; ++round)
    for (int i = kFibers - 1; i >= 0; --i) {
      mtlsim::switch_context(scheduler, contexts[i]);
    }
  for (int i = 0; i < kFibers; ++i) {
    double want = i;
    for (int round = 0; round < kRounds; ++round) want = work(i, round, want);
    check(results[i] == want, "fiber result");
  }
  check(stacks.guard_owner(stacks.stack(3) - 1) == 3, "guard page below stack 3");
  check(stacks.guard_owner(stacks.stack(3)) == -1, "stack memory is not a guard page");
  std::puts("OK");
  return 0;
}
