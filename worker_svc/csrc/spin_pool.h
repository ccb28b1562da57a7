// The step kernels' own threads (csrc/small_batch_linear.cpp, csrc/paged_decode_attention.cpp: one
// extension, so one pool in a process), for the work of a decode step of a few sequences.
//
// A step of one sequence runs its linear layers tens of microseconds apart. OpenMP's threads in
// the worker wait passively (OMP_WAIT_POLICY=PASSIVE, for hosts with more work than cores): each
// parallel region woke them with a futex, which cost more than the region's work. These threads
// spin between jobs, yielding the core to any other runnable thread after the first
// microseconds, and sleep on a futex once no job came for kSpin, so an idle worker holds no core.
#pragma once
#include <sched.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace stepserve {

class SpinPool {
 public:
  static constexpr int kMaxThreads = 256;

  static SpinPool& instance() {
    static SpinPool pool;
    return pool;
  }

  // fn(worker) on `threads` threads (the caller is worker 0), returning when every one is done. fn
  // takes its work from a counter it shares with the others until none is left, so that a thread
  // the host slowed leaves its share to the rest, and one call of it alone does it all: where the
  // pool is busy (a job's own call), the caller runs it alone.
  void run(int threads, const std::function<void(int)>& fn) {
    threads = std::clamp(threads, 1, kMaxThreads);
    if (threads == 1 || in_job()) return fn(0);
    in_job() = true;
    grow(threads - 1);
    job_ = &fn;
    remaining_.store(threads - 1, std::memory_order_relaxed);
    // One word says both that a job is there and which threads take it, so a thread never pairs
    // one job's count with another's.
    const uint32_t word = ((job_word_.load(std::memory_order_relaxed) >> 8) + 1) << 8 | (threads - 1);
    job_word_.store(word, std::memory_order_release);
    if (sleeping_.load(std::memory_order_acquire) > 0) job_word_.notify_all();
    fn(0);
    while (remaining_.load(std::memory_order_acquire) > 0) relax();
    in_job() = false;
  }

 private:
  static constexpr auto kSpin = std::chrono::microseconds(300);
  static constexpr auto kSpinAlone = std::chrono::microseconds(20);  // before yielding the core

  static bool& in_job() {  // this thread runs a job of the pool's
    thread_local bool flag = false;
    return flag;
  }

  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  void grow(int helpers) {
    while (static_cast<int>(threads_.size()) < helpers) {
      const int index = static_cast<int>(threads_.size()) + 1;
      // the word as it is now: a job posted before the thread first runs is still new to it
      const uint32_t seen = job_word_.load(std::memory_order_relaxed);
      threads_.emplace_back([this, index, seen] { loop(index, seen); });
      threads_.back().detach();  // lives as long as the process
    }
  }

  void loop(int index, uint32_t seen) {
    for (;;) {
      seen = wait_for_job(seen);
      if (index <= static_cast<int>(seen & 0xff)) {  // the caller waits for every taker: job_ is this job's
        in_job() = true;
        (*job_)(index);
        in_job() = false;
        remaining_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  uint32_t wait_for_job(uint32_t seen) {
    auto since = std::chrono::steady_clock::now();
    for (uint32_t spins = 1;; ++spins) {
      const uint32_t word = job_word_.load(std::memory_order_acquire);
      if (word != seen) return word;
      if (spins % 64) {
        relax();
        continue;
      }
      const auto waited = std::chrono::steady_clock::now() - since;
      if (waited < kSpinAlone) continue;
      if (waited < kSpin) {
        sched_yield();
        continue;
      }
      sleeping_.fetch_add(1, std::memory_order_acq_rel);
      job_word_.wait(seen, std::memory_order_acquire);
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      since = std::chrono::steady_clock::now();
    }
  }

  std::vector<std::thread> threads_;
  std::atomic<uint32_t> job_word_{0};  // job number << 8 | the threads that take it
  std::atomic<int> remaining_{0};
  std::atomic<int> sleeping_{0};
  const std::function<void(int)>* job_ = nullptr;
};

}  // namespace stepserve
