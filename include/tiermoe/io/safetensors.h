#pragma once
// safetensors files (huggingface/safetensors format): an mmap'ed reader that
// validates exactly as the reference reader does (plus an explicit duplicate
// key check), a writer that pads the header to 8 bytes and writes atomically,
// and sharded checkpoints through model.safetensors.index.json.
//
// Every rejection throws tiermoe::Error naming the file, the tensor (when one
// is involved) and the rule that was broken.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

// One tensor entry of a safetensors header. `dtype` is the format's string
// ("BF16", "F32", "I64", ...); `begin`/`end` are byte offsets relative to the
// start of the data buffer.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// Bits per element of a safetensors dtype string; throws on unknown strings.
uint64_t safetensors_dtype_bits(const std::string& dtype);
// The safetensors dtype string of a TierMoE dtype ("F64", "F32", "BF16").
std::string safetensors_dtype_name(DType dtype);

class SafetensorsFile {
 public:
  // Maps and validates the whole header; throws Error on any violation.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Entries sorted by offset (the on-disk order).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming file and tensor
  std::span<const std::byte> bytes(const std::string& name) const;
  uint64_t file_size() const;
  // Keeps the file mapped: the owner of views of bytes(), which stay valid
  // as long as any holder of it lives.
  std::shared_ptr<const void> mapping() const { return map_; }

  // Names the tensors stored under `stored` as under `as` from now on
  // ("model.language_model.x" read as "model.x"); an Error when a renamed
  // tensor would meet a tensor of that name.
  void read_prefix_as(const std::string& stored, const std::string& as);

  // Returns the pages wholly inside tensor `name`'s bytes to the kernel
  // (madvise DONTNEED) once a reader has copied them: the process's resident
  // set stops counting them, and a later read gets the file's bytes again.
  // Only for tensors nothing has written through a view (the mapping is
  // copy-on-write: a written page would revert to the file's bytes).
  void release(const std::string& name) const;
  // A zero-copy view of an F64, F32 or BF16 tensor (it keeps the mapping
  // alive). The mapping is copy-on-write: writing into a view never changes
  // the file. Data that another writer left unaligned for its dtype comes
  // back as a copy. Other dtypes are an error naming the tensor.
  Tensor view(const std::string& name) const;
  // A new tensor converted to `dtype` (F64/F32/BF16 sources; to bf16 rounds
  // to nearest even, f64 going through f32 as torch does).
  Tensor load(const std::string& name, DType dtype, MemTag tag = MemTag::weights) const;

 private:
  struct Mapping;
  static std::shared_ptr<Mapping> map_file(const std::string& path);
  std::string path_;
  std::shared_ptr<Mapping> map_;
  uint64_t data_offset_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes one safetensors file: header padded with spaces to a multiple of 8,
// tensors sorted as the reference writer does (dtype alignment descending,
// then name), `{"format":"pt"}` metadata unless `metadata` says otherwise.
// Written to a temporary file, fsync'ed, then renamed over `path`, so an
// existing file is never left half-written.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// A tensor of any safetensors dtype given as its bytes (low-bit codes, I64
// shapes): `data` holds nbytes = numel(shape) * the dtype's size, valid
// until the write returns. The same rules and order as above.
struct TensorBytes {
  std::string name;
  std::string dtype;  // "I32", "F8_E4M3", ...
  Shape shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};
void save_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// A Hugging Face checkpoint's tensors: `model.safetensors`, or the shards
// listed in `model.safetensors.index.json`. Names map to their shard.
class CheckpointTensors {
 public:
  // `dir` is a checkpoint directory (the index wins over model.safetensors
  // when both exist) or a single .safetensors file. The index is checked:
  // every listed shard exists, every mapped tensor is in its shard, every
  // tensor of a listed shard is mapped, and no tensor is in two shards.
  static CheckpointTensors open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  Tensor view(const std::string& name) const;
  Tensor load(const std::string& name, DType dtype, MemTag tag = MemTag::weights) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  // A multimodal checkpoint (Qwen3.5's) holds its language model under
  // model.language_model.: read it as model., as transformers' text model
  // does (AutoModelForCausalLM on it); the vision tower keeps its names.
  void read_language_model();

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> shard_of_;  // name -> index in files_
};

// Writes `tensors` into `dir` (created if needed) as `model.safetensors`,
// or, when they exceed `max_shard_bytes`, as `model-0000i-of-0000n.safetensors`
// shards plus `model.safetensors.index.json` (huggingface_hub's split and
// naming: shards fill greedily in the given order; a tensor larger than the
// limit gets a shard of its own). Each file is replaced atomically, the index
// last; then files of an earlier save in the other layout (a stale index,
// model.safetensors or surplus shards) are removed. Returns the paths
// written, the index last.
std::vector<std::string> save_checkpoint_tensors(const std::string& dir,
                                                 const NamedTensors& tensors,
                                                 uint64_t max_shard_bytes = 5'000'000'000ull);

// The pieces of save_checkpoint_tensors, for writers that produce one shard
// at a time instead of holding the whole model: the hub's split of tensors
// with these byte sizes (indices into `bytes`, in order; one shard when
// everything fits), the shard file name ("model.safetensors" when n == 1),
// and the index (written atomically; `weight_map` is tensor name -> shard
// file name, `total_size` the sum of tensor bytes).
std::vector<std::vector<size_t>> plan_checkpoint_shards(const std::vector<uint64_t>& bytes,
                                                        uint64_t max_shard_bytes);
std::string checkpoint_shard_name(size_t i, size_t n);
void save_checkpoint_index(const std::string& dir,
                           const std::map<std::string, std::string>& weight_map,
                           uint64_t total_size);

}  // namespace tiermoe
