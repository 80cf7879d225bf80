// A small fixed pool of threads for work split into parts: the disk tier's
// batched reads (log_tier.cc) and the table's benchmark driver
// (benchmarks/native/table_bench.cc). No TensorFlow: inside ops, table work
// runs on TF's own intra-op pool (table_resource.h IntraOpRunner).
#ifndef GRAPHMOD_NATIVE_THREAD_POOL_H_
#define GRAPHMOD_NATIVE_THREAD_POOL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace graphmod {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads in the pool (the caller of Run works too).
  int size() const { return static_cast<int>(threads_.size()); }

  // Runs fn(0) .. fn(parts - 1) and returns when all are done. The caller
  // and up to size() pool threads take parts in turn until none is left, so
  // uneven parts balance and the caller never waits idle while parts remain.
  void Run(size_t parts, const std::function<void(size_t)>& fn) {
    if (parts <= 1 || threads_.empty()) {
      for (size_t p = 0; p < parts; ++p) fn(p);
      return;
    }
    std::atomic<size_t> next{0};
    auto drain = [&] {
      for (size_t p; (p = next.fetch_add(1)) < parts;) fn(p);
    };
    std::mutex done_mu;
    std::condition_variable done_cv;
    size_t helpers = std::min(parts - 1, threads_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t h = 0, n = helpers; h < n; ++h) {
        tasks_.push_back([&] {
          drain();
          std::lock_guard<std::mutex> done(done_mu);
          if (--helpers == 0) done_cv.notify_one();
        });
      }
    }
    cv_.notify_all();
    drain();
    // Every helper has run (and left `next`) before the frame goes.
    std::unique_lock<std::mutex> done(done_mu);
    done_cv.wait(done, [&] { return helpers == 0; });
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_THREAD_POOL_H_
