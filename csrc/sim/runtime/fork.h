// fork() safety for the process-wide mutexes of the runtime and the
// extension: the forking thread takes every registered mutex before fork and
// releases it in both processes after, so a child never starts with a mutex
// held by a thread that does not exist in it, nor with the data it guards
// half-modified.
#pragma once

#include <mutex>

namespace mtlsim {

// Mutexes are taken in increasing rank: a thread holding one may only wait
// for ones of a higher rank.
enum class ForkRank { Overrides, Backend, Modules, Checked, Trace, Pool };

// Registers `mu` (which must outlive the process, e.g. a static).
void fork_protect(std::mutex& mu, ForkRank rank);

}  // namespace mtlsim
