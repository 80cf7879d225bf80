// The table's own many-core benchmark: no TensorFlow, no Python, one static
// binary (make bench-native), so it runs on any x86-64 host, also one
// without TensorFlow.
//
// A table of --keys keys (filled first: that is the fill figure) is driven
// through EmbeddingTable's FindOrInsert (train), Find (read) and Apply
// (apply, SGD by handle) in batches of --batch ids, uniform or Zipf(1.05)
// over the keys, against a static gather (rows of a dense array) and a plain
// scatter (row -= lr * grad) of the same ids with the same threads. Work is
// split by a runner that cuts (n, cost) as TensorFlow's intra-op pool does
// (Eigen's ParallelFor: inline under ~100k cycles, blocks of >= 40k cycles,
// at most 4 blocks a thread), over a pool of --threads threads.
//
// Per phase: the runner times how long each call spends inside parallel
// sections; the rest of a call is serial. At one thread, that serial share s
// bounds the speed-up at N threads (Amdahl) by 1 / (s + (1 - s) / N).
//
// --layout arena|buckets and --storage float32|float16|bfloat16|int8 pick the
// table's shard layout and how it stores rows (row_codec.h).
//
// Output: a Markdown table on stdout and, with --json, every figure.
//
//   build/table_bench --keys 8000000 --dims 16,64 --threads 1,2,4,8,16 \
//       --dists uniform,zipf --json out.json
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "native/table.h"
#include "native/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using graphmod::EmbeddingTable;
using graphmod::TableConfig;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Eigen's ParallelFor block sizing (TensorFlow's intra-op pool), simplified:
// inline when the whole is under ~100k cycles; else blocks of at least 40k
// cycles, at most 4 per thread.
struct Runner {
  graphmod::ThreadPool* pool;  // threads besides the caller
  double inside = 0;  // seconds spent in parallel sections (the calling thread's view)
  void operator()(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    const auto t0 = Clock::now();
    const double total = static_cast<double>(n) * std::max<int64_t>(cost, 1);
    const int threads = pool->size() + 1;
    if (threads == 1 || total < 100000) {
      fn(0, n);
    } else {
      const int64_t min_block = std::max<int64_t>(1, 40000 / std::max<int64_t>(cost, 1));
      const int64_t max_blocks = 4 * threads;
      const int64_t block = std::max(min_block, (n + max_blocks - 1) / max_blocks);
      const int64_t blocks = (n + block - 1) / block;
      pool->Run(static_cast<size_t>(blocks), [&](size_t i) {
        const int64_t b = static_cast<int64_t>(i) * block;
        fn(b, std::min(n, b + block));
      });
    }
    inside += Seconds(t0, Clock::now());
  }
  graphmod::Runner AsRunner() {
    return [this](int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
      (*this)(n, cost, fn);
    };
  }
};

int64_t KeyOf(int64_t rank) { return (rank * 2654435761LL) % (int64_t{1} << 62); }

// Zipf(s) ranks over [0, n) by inverting the continuous approximation of
// its distribution: exact enough for a benchmark's hot/cold mix.
int64_t ZipfRank(double u, int64_t n, double s) {
  const double a = 1.0 - s;
  const double x = std::pow((std::pow(static_cast<double>(n), a) - 1.0) * u + 1.0, 1.0 / a);
  return std::min<int64_t>(n - 1, static_cast<int64_t>(x) - 1);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

struct Figure {
  std::string op, dist;
  int dim = 0, threads = 0;
  double mkeys = 0, cpu_per_mkey = 0, serial = 0;
};

struct Options {
  int64_t keys = 8000000, batch = 65536;
  int warmup = 2, timed = 10;
  std::vector<int> dims = {16}, threads = {1, 2};
  std::vector<std::string> dists = {"uniform", "zipf"};
  // (fill always: it builds the table)
  std::vector<std::string> ops = {"gather", "train", "read", "scatter", "apply"};
  std::string layout = "arena", json;
  graphmod::StorageType storage = graphmod::StorageType::kFloat32;  // --storage float16 ...
  int shards = 16;
};

// Times `timed` calls of fn(batch index) after `warmup` untimed ones: M ids/s,
// CPU-seconds per M ids, and the serial share of the calls' wall time.
Figure Time(const Options& o, Runner* runner, const std::function<void(int)>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn(i);
  runner->inside = 0;
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < o.timed; ++i) fn(o.warmup + i);
  const double wall = Seconds(t0, Clock::now()), cpu = CpuSeconds() - cpu0;
  Figure f;
  const double mkeys = static_cast<double>(o.batch) * o.timed / 1e6;
  f.mkeys = mkeys / wall;
  f.cpu_per_mkey = cpu / mkeys;
  f.serial = std::max(0.0, 1.0 - runner->inside / wall);
  return f;
}

void Run(const Options& o, std::vector<Figure>* out) {
  const int batches = o.warmup + o.timed;
  for (int dim : o.dims) {
    for (int threads : o.threads) {
      graphmod::ThreadPool pool(threads - 1);
      Runner runner{&pool};
      const graphmod::Runner run = runner.AsRunner();
      TableConfig c;
      c.name = "bench";
      c.dim = dim;
      c.num_shards = o.shards;
      c.layout = o.layout;
      c.values_type = c.slots_type = o.storage;
      c.init = graphmod::Initializer::kUniform;
      c.init_a = -0.05f;
      c.init_b = 0.05f;
      EmbeddingTable table(c);
      std::vector<float> values(o.batch * dim), grads(o.batch * dim, 0.01f);
      std::vector<int64_t> handles(o.batch), ids(o.batch);
      // Fill: every key, new, a batch at a time.
      {
        runner.inside = 0;
        const double cpu0 = CpuSeconds();
        const auto t0 = Clock::now();
        for (int64_t b = 0; b < o.keys; b += o.batch) {
          const int64_t n = std::min(o.batch, o.keys - b);
          for (int64_t i = 0; i < n; ++i) ids[i] = KeyOf(b + i);
          table.FindOrInsert(ids.data(), n, 1, -1, values.data(), nullptr, run);
        }
        const double wall = Seconds(t0, Clock::now());
        Figure f{"fill", "new", dim, threads};
        f.mkeys = o.keys / 1e6 / wall;
        f.cpu_per_mkey = (CpuSeconds() - cpu0) / (o.keys / 1e6);
        f.serial = std::max(0.0, 1.0 - runner.inside / wall);
        out->push_back(f);
        std::fprintf(stderr, "dim %d threads %d: filled %lld keys, %.1f bytes/key\n", dim,
                     threads, static_cast<long long>(table.size()),
                     static_cast<double>(table.memory_bytes()) / table.size());
      }
      // The static array of the same rows: rows for keys' ranks.
      std::vector<float> dense(static_cast<size_t>(o.keys) * dim);
      run(o.keys, dim, [&](int64_t b, int64_t e) {  // first touch by the threads that read it
        for (int64_t i = b; i < e; ++i)
          std::fill(&dense[i * dim], &dense[i * dim] + dim, 0.01f * static_cast<float>(i % 7));
      });
      for (const std::string& dist : o.dists) {
        std::mt19937_64 rng(7);
        std::uniform_real_distribution<double> unit(0, 1);
        std::vector<std::vector<int64_t>> ranks(batches, std::vector<int64_t>(o.batch));
        std::vector<std::vector<int64_t>> keys(batches, std::vector<int64_t>(o.batch));
        for (int b = 0; b < batches; ++b)
          for (int64_t i = 0; i < o.batch; ++i) {
            ranks[b][i] = dist == "zipf" ? ZipfRank(unit(rng), o.keys, 1.05)
                                         : static_cast<int64_t>(rng() % o.keys);
            keys[b][i] = KeyOf(ranks[b][i]);
          }
        // Times op (if asked for) over the batches.
        auto measure = [&](const char* op, const std::function<void(int)>& fn) {
          if (std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end()) return;
          Figure f = Time(o, &runner, fn);
          f.op = op, f.dist = dist, f.dim = dim, f.threads = threads;
          out->push_back(f);
        };
        measure("gather", [&](int b) {
          const int64_t* r = ranks[b].data();
          float* v = values.data();
          run(o.batch, 2 * dim + 10, [&](int64_t s, int64_t e) {
            for (int64_t i = s; i < e; ++i)
              std::memcpy(v + i * dim, &dense[r[i] * dim], sizeof(float) * dim);
          });
        });
        measure("train", [&](int b) {
          table.FindOrInsert(keys[b].data(), o.batch, 2, -1, values.data(), handles.data(), run);
        });
        measure("read", [&](int b) { table.Find(keys[b].data(), o.batch, values.data(), run); });
        // Apply by the handles of one lookup (as a step does); the scatter
        // updates the same rows. (Its duplicate ids race, as in TF's unlocked
        // scatter: it is the ceiling, not a reference; ThreadSanitizer runs
        // leave it out.)
        table.FindOrInsert(keys[0].data(), o.batch, 3, -1, values.data(), handles.data(), run);
        graphmod::Optimizer sgd;
        sgd.lr = 0.1f;
        measure("apply", [&](int) {
          table.Apply(sgd, handles.data(), true, grads.data(), o.batch, run);
        });
        measure("scatter", [&](int) {
          const int64_t* r = ranks[0].data();
          const float* g = grads.data();
          run(o.batch, 3 * dim + 10, [&](int64_t s, int64_t e) {
            for (int64_t i = s; i < e; ++i) {
              float* row = &dense[r[i] * dim];
              for (int k = 0; k < dim; ++k) row[k] -= 0.1f * g[i * dim + k];
            }
          });
        });
      }
    }
  }
}

const Figure* FindFigure(const std::vector<Figure>& all, const std::string& op,
                         const std::string& dist, int dim, int threads) {
  for (const Figure& f : all)
    if (f.op == op && (f.dist == dist || op == "fill") && f.dim == dim && f.threads == threads)
      return &f;
  return nullptr;
}

void Print(const Options& o, const std::vector<Figure>& all) {
  std::printf("| op | ids | dim |");
  for (int t : o.threads) std::printf(" %d thr |", t);
  std::printf(" serial share at 1 thr | Amdahl bound at 16 thr |\n|---|---|---|");
  for (size_t i = 0; i < o.threads.size(); ++i) std::printf("---|");
  std::printf("---|---|\n");
  for (int dim : o.dims) {
    for (const std::string& dist : o.dists) {
      for (const char* op : {"gather", "train", "read", "scatter", "apply", "fill"}) {
        if (std::string(op) == "fill" ? dist != o.dists[0]
                                      : std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end())
          continue;
        const char* peer = std::string(op) == "apply" ? "scatter" : "gather";
        const bool ours = std::string(op) == "train" || std::string(op) == "read" ||
                          std::string(op) == "apply";
        std::printf("| %s | %s | %d |", op, std::string(op) == "fill" ? "new" : dist.c_str(), dim);
        double serial = -1;
        for (int t : o.threads) {
          const Figure* f = FindFigure(all, op, dist, dim, t);
          const Figure* p = FindFigure(all, peer, dist, dim, t);
          if (f == nullptr) {
            std::printf(" |");
            continue;
          }
          if (t == 1) serial = f->serial;
          if (ours && p != nullptr)
            std::printf(" %.1f (%.2fx) |", f->mkeys, f->mkeys / p->mkeys);
          else
            std::printf(" %.1f |", f->mkeys);
        }
        if (serial >= 0)
          std::printf(" %.3f | %.1fx |\n", serial, 1.0 / (serial + (1.0 - serial) / 16.0));
        else
          std::printf(" | |\n");
      }
    }
  }
  std::printf("\nM ids/s (ratio to the static gather, or for apply the plain scatter); "
              "CPU-s per M ids in the JSON.\n");
}

void WriteJson(const Options& o, const std::vector<Figure>& all) {
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", o.json.c_str());
    std::exit(1);
  }
  std::fprintf(f, "{\"keys\": %lld, \"batch\": %lld, \"layout\": \"%s\", \"shards\": %d, "
               "\"hardware_threads\": %u, \"figures\": [\n",
               static_cast<long long>(o.keys), static_cast<long long>(o.batch), o.layout.c_str(),
               o.shards, std::thread::hardware_concurrency());
  for (size_t i = 0; i < all.size(); ++i) {
    const Figure& x = all[i];
    std::fprintf(f,
                 "  {\"op\": \"%s\", \"ids\": \"%s\", \"dim\": %d, \"threads\": %d, "
                 "\"mkeys_per_s\": %.3f, \"cpu_s_per_mkey\": %.4f, \"serial_share\": %.4f}%s\n",
                 x.op.c_str(), x.dist.c_str(), x.dim, x.threads, x.mkeys, x.cpu_per_mkey,
                 x.serial, i + 1 < all.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--keys") {
      o.keys = std::atoll(value().c_str());
    } else if (arg == "--batch") {
      o.batch = std::atoll(value().c_str());
    } else if (arg == "--dims") {
      o.dims.clear();
      for (const auto& d : Split(value())) o.dims.push_back(std::atoi(d.c_str()));
    } else if (arg == "--threads") {
      o.threads.clear();
      for (const auto& t : Split(value())) o.threads.push_back(std::atoi(t.c_str()));
    } else if (arg == "--dists") {
      o.dists = Split(value());
    } else if (arg == "--ops") {
      o.ops = Split(value());
    } else if (arg == "--layout") {
      o.layout = value();
    } else if (arg == "--storage") {
      if (!graphmod::ParseStorageType(value(), &o.storage)) {
        std::fprintf(stderr, "--storage: float32, float16, bfloat16 or int8\n");
        return 2;
      }
    } else if (arg == "--shards") {
      o.shards = std::atoi(value().c_str());
    } else if (arg == "--timed") {
      o.timed = std::atoi(value().c_str());
    } else if (arg == "--json") {
      o.json = value();
    } else {
      std::fprintf(stderr, "unknown argument %s (see the top of benchmarks/native/table_bench.cc)\n",
                   arg.c_str());
      return 2;
    }
  }
  for (const auto& d : o.dists)
    if (d != "uniform" && d != "zipf") {
      std::fprintf(stderr, "--dists: uniform or zipf, got %s\n", d.c_str());
      return 2;
    }
  if (o.keys < o.batch || o.batch <= 0) {
    std::fprintf(stderr, "--keys must be at least --batch (> 0)\n");
    return 2;
  }
  std::vector<Figure> all;
  Run(o, &all);
  Print(o, all);
  if (!o.json.empty()) WriteJson(o, all);
  return 0;
}
