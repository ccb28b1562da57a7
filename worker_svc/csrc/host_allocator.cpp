// torch's CPU allocator for a generative worker: blocks of 1 MiB and more are mapped once and,
// when freed, kept for the next request of about their size (at most 1/8 larger), up to a limit
// of cached bytes; smaller blocks go to the allocator it replaces (glibc's malloc).
//
// Why: a CPU step allocates its activations fresh in every layer of every step. glibc maps each
// block over its mmap threshold (at most 32 MiB) anew and unmaps it on free, so a long prefill's
// widest activations (8,192 tokens of Qwen3-0.6B: 64 MiB of q/k/v, 96 MiB of gate/up) were
// faulted in page by page, zeroed by the kernel, in every layer: Qwen3-0.6B's 512-token
// prefills ran 10% slower than under tcmalloc, which keeps them. Keeping them in glibc's heap
// instead (no mmap, no trim) was as fast but grew without bound: torch's 64-byte-aligned
// requests need a little more than the block freed before them, so a block of the same size
// seldom fits where the last one was. Here a block is found by size: the steps' sizes recur
// (compiled steps pad the token axis to a few buckets), so after the first steps every large
// activation is a block already faulted in.
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace {

constexpr size_t kLargeBytes = size_t(1) << 20;  // smaller blocks: the replaced allocator's
constexpr size_t kGranule = size_t(1) << 16;     // large sizes rounded up to 64 KiB
constexpr size_t kSlackDivisor = 8;              // a cached block serves requests down to 7/8 of it

class BlockCache final : public c10::Allocator {
 public:
  void install(size_t limit_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_bytes_ = limit_bytes;
    if (replaced_ == nullptr) {
      replaced_ = c10::GetCPUAllocator();
      c10::SetCPUAllocator(this, /*priority=*/1);
    }
  }

  c10::DataPtr allocate(size_t n) override {
    if (n < kLargeBytes) return replaced_->allocate(n);
    const size_t wanted = (n + kGranule - 1) / kGranule * kGranule;
    void* block = nullptr;
    size_t size = wanted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cached_.lower_bound(wanted);
      if (it != cached_.end() && it->first - wanted <= it->first / kSlackDivisor) {
        size = it->first;
        block = it->second;
        cached_bytes_ -= size;
        cached_.erase(it);
        ++hits_;
      }
    }
    const bool mapped = block == nullptr;
    if (mapped) {
      block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (block == MAP_FAILED) {
        release_cached();  // what the cache holds may be what the system lacks: try once more without it
        block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        TORCH_CHECK_WITH(OutOfMemoryError, block != MAP_FAILED, "host block cache: could not map ", size, " bytes");
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      maps_ += mapped;
      live_.emplace(block, size);
    }
    return {block, block, &BlockCache::free_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &BlockCache::free_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // A block of ours goes back to the cache (or to the system past the limit); any other pointer
  // (raw_deallocate of a small block) to the C library, as the replaced allocator frees it.
  static void free_block(void* block) {
    BlockCache& self = instance();
    size_t size;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.live_.find(block);
      if (it == self.live_.end()) {
        c10::free_cpu(block);
        return;
      }
      size = it->second;
      self.live_.erase(it);
      if (self.cached_bytes_ + size <= self.limit_bytes_) {
        self.cached_.emplace(size, block);
        self.cached_bytes_ += size;
        return;
      }
    }
    munmap(block, size);
  }

  void release_cached() {
    std::multimap<size_t, void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(cached_);
      cached_bytes_ = 0;
    }
    for (const auto& [size, block] : blocks) munmap(block, size);
  }

  std::map<std::string, int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {{"cached_bytes", static_cast<int64_t>(cached_bytes_)},
            {"cached_blocks", static_cast<int64_t>(cached_.size())},
            {"live_blocks", static_cast<int64_t>(live_.size())},
            {"limit_bytes", static_cast<int64_t>(limit_bytes_)},
            {"hits", hits_},
            {"maps", maps_},
            {"installed", replaced_ != nullptr}};
  }

  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache();  // never destroyed: tensors may outlive static destructors
    return *cache;
  }

 private:
  std::mutex mutex_;
  c10::Allocator* replaced_ = nullptr;
  size_t limit_bytes_ = 0;
  size_t cached_bytes_ = 0;
  std::multimap<size_t, void*> cached_;       // size -> a free block of that size
  std::unordered_map<void*, size_t> live_;    // a block in use -> its size
  int64_t hits_ = 0, maps_ = 0;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", [](int64_t limit_bytes) { BlockCache::instance().install(static_cast<size_t>(limit_bytes)); },
        "make the block cache torch's CPU allocator, keeping at most limit_bytes of freed large blocks",
        pybind11::arg("limit_bytes"));
  m.def("stats", [] { return BlockCache::instance().stats(); },
        "cached and live bytes and blocks, the limit, cache hits and fresh mappings");
}
