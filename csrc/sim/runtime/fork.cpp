#include "fork.h"

#include <pthread.h>

#include <algorithm>
#include <vector>

namespace mtlsim {

namespace {

struct Entry {
  std::mutex* mu;
  ForkRank rank;
};

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

void lock_all() {
  registry_mu().lock();
  for (Entry& e : registry()) e.mu->lock();
}

void unlock_all() {
  for (auto it = registry().rbegin(); it != registry().rend(); ++it) it->mu->unlock();
  registry_mu().unlock();
}

}  // namespace

void fork_protect(std::mutex& mu, ForkRank rank) {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(lock_all, unlock_all, unlock_all); });
  std::lock_guard<std::mutex> lock(registry_mu());
  auto& entries = registry();
  entries.insert(std::upper_bound(entries.begin(), entries.end(), rank,
                                  [](ForkRank r, const Entry& e) { return r < e.rank; }),
                 Entry{&mu, rank});
}

}  // namespace mtlsim
