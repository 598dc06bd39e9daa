#pragma once
// Runs a piece of code in a child process whose address space may grow by
// only a little, so a test can show that a reader rejects a hostile size
// before allocating it (without the test itself allocating gigabytes).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <functional>

namespace tiermoe::testing {

// AddressSanitizer reserves terabytes of address space: a cap breaks it.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kCanCapMemory = false;
#else
inline constexpr bool kCanCapMemory = true;
#endif

inline uint64_t address_space_bytes() {
  unsigned long long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return uint64_t(pages) * uint64_t(::sysconf(_SC_PAGESIZE));
}

// Forks; the child caps its address space at its current size + `extra`
// bytes and exits with fn()'s result. Returns that exit status, or -1 when
// the child died of a signal (an uncaught bad_alloc aborts).
inline int run_with_memory_cap(uint64_t extra, const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlimit cap{address_space_bytes() + extra, address_space_bytes() + extra};
    ::setrlimit(RLIMIT_AS, &cap);
    int rc = 2;
    try {
      rc = fn();
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace tiermoe::testing
