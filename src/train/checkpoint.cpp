#include "tiermoe/train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/model/checkpoint.h"
#include "tiermoe/model/linear.h"

namespace tiermoe {

namespace fs = std::filesystem;
using detail::str_of;
using nlohmann::json;

std::string checkpoint_dir_name(int64_t step) { return str_of("checkpoint-", step); }

namespace {

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  TIERMOE_CHECK(fd >= 0, str_of("cannot open for fsync: ", std::strerror(errno)), p.string(),
                "check the file system");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TIERMOE_CHECK(rc == 0, str_of("fsync failed: ", std::strerror(err)), p.string(),
                "check free disk space");
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  TIERMOE_CHECK(out.good(), "cannot write file", path.string(), "check free disk space");
}

json read_json(const fs::path& path) {
  require_regular_file(path.string(), "checkpoint file", "is this a tiermoe checkpoint?");
  std::ifstream in(path, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot read file", path.string(), "is this a tiermoe checkpoint?");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(str_of("malformed JSON: ", e.what()), path.string(), "the checkpoint is corrupt");
  }
}

json sampler_json(const SamplerPosition& p) {
  return {{"seed", p.seed},
          {"epoch", p.epoch},
          {"index", p.index},
          {"seq_len", p.seq_len},
          {"num_windows", p.num_windows},
          {"shuffle", p.shuffle}};
}

SamplerPosition sampler_from_json(const json& j) {
  SamplerPosition p;
  p.seed = j.at("seed").get<uint64_t>();
  p.epoch = j.at("epoch").get<int64_t>();
  p.index = j.at("index").get<int64_t>();
  p.seq_len = j.at("seq_len").get<int64_t>();
  p.num_windows = j.at("num_windows").get<int64_t>();
  p.shuffle = j.at("shuffle").get<bool>();
  return p;
}

// An absolute path: PEFT and transformers read a relative one that does not
// exist from their own working directory as a Hub repo id.
std::string base_model_name(const TrainConfig& c) {
  if (c.model_dir.empty()) return str_of("tiermoe preset ", c.preset, " seed ", c.seed);
  fs::path p = fs::absolute(c.model_dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p.string();
}

std::string optimizer_shard_name(int rank, int ranks) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer-%05d-of-%05d.safetensors", rank + 1, ranks);
  return name;
}

bool is_optimizer_shard_name(const std::string& name) {
  static const std::regex pattern(R"(optimizer-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(name, pattern);
}

// The whole model's weights written by P ranks together as one Hugging Face
// sharded checkpoint: rank r's shards are numbered after the ranks before
// it, and rank 0 writes the index of all of them. Made (collectively) before
// the directory is written, so that the write itself needs no collective.
struct RankShards {
  NamedTensors tensors;
  std::vector<std::vector<size_t>> plan;          // this rank's shards: indices into tensors
  size_t first = 0, total = 0;                    // global number of its first shard; all ranks'
  std::map<std::string, std::string> weight_map;  // rank 0: every tensor's shard
  uint64_t total_size = 0;
};

constexpr uint64_t kMaxShardBytes = 5'000'000'000ull;

RankShards plan_rank_shards(const CausalLM& model, DType storage) {
  Comm& comm = *model.comm();
  RankShards out;
  out.tensors = model.checkpoint_tensors(storage, /*experts_only=*/comm.rank() != 0);
  std::vector<uint64_t> bytes;
  uint64_t mine = 0;
  for (const auto& [name, t] : out.tensors) {
    bytes.push_back(t.nbytes());
    mine += t.nbytes();
  }
  out.plan = plan_checkpoint_shards(bytes, kMaxShardBytes);
  const std::vector<int64_t> counts = comm.allgather_value(int64_t(out.plan.size()), "shards");
  for (int r = 0; r < comm.size(); ++r) {
    if (r < comm.rank()) out.first += size_t(counts[size_t(r)]);
    out.total += size_t(counts[size_t(r)]);
  }
  std::string index;  // "name\tshard\n" per tensor
  for (size_t sh = 0; sh < out.plan.size(); ++sh) {
    for (size_t i : out.plan[sh]) {
      index +=
          out.tensors[i].first + "\t" + checkpoint_shard_name(out.first + sh, out.total) + "\n";
    }
  }
  const std::vector<std::string> all = comm.allgather_text(index, "checkpoint index");
  for (const int64_t b : comm.allgather_value(int64_t(mine), "checkpoint size")) {
    out.total_size += uint64_t(b);
  }
  if (comm.rank() == 0) {
    for (const std::string& text : all) {
      std::istringstream in(text);
      std::string line;
      while (std::getline(in, line)) {
        const size_t tab = line.find('\t');
        out.weight_map[line.substr(0, tab)] = line.substr(tab + 1);
      }
    }
  }
  return out;
}

void write_rank_shards(const std::string& dir, const RankShards& rs, const CausalLM& model,
                       DType storage) {
  for (size_t sh = 0; sh < rs.plan.size(); ++sh) {
    NamedTensors shard;
    for (size_t i : rs.plan[sh]) shard.push_back(rs.tensors[i]);
    save_safetensors((fs::path(dir) / checkpoint_shard_name(rs.first + sh, rs.total)).string(),
                     shard);
  }
  if (model.comm()->rank() == 0) {
    save_checkpoint_index(dir, rs.weight_map, rs.total_size);
    ModelConfig c = model.config();
    c.torch_dtype = torch_dtype_name(storage);
    save_model_config(c, (fs::path(dir) / "config.json").string());
  }
}

// The whole model's weights (full fine-tuning) or LoRA adapter, gathered or
// planned across ranks (collectives), then written by write() with no
// collective: LoRA by rank 0 alone, weights by every rank.
struct ModelWriter {
  const CausalLM& model;
  const TrainConfig& config;
  DType adapter_dtype;
  PeftLoraModules adapter;  // LoRA: every module (gathered)
  std::optional<RankShards> shards;

  ModelWriter(const CausalLM& m, const TrainConfig& c, DType adapter_storage)
      : model(m), config(c), adapter_dtype(adapter_storage) {
    if (config.lora) {
      adapter = model.gather_lora_modules();
    } else if (model.ep_ranks() > 1) {
      shards = plan_rank_shards(model, model.dtype());
    }
  }

  // with_config: a LoRA checkpoint also records the base model's config.json.
  void write(const std::string& dir, bool with_config) const {
    const bool rank0 = model.ep_ranks() == 1 || model.comm()->rank() == 0;
    if (config.lora) {
      if (!rank0) return;
      save_peft_adapter(dir, to_peft_config(model.lora_config(), base_model_name(config)), adapter,
                        adapter_dtype);
      if (with_config) save_model_config(model.config(), (fs::path(dir) / "config.json").string());
    } else if (shards) {
      write_rank_shards(dir, *shards, model, model.dtype());
    } else {
      model.save_checkpoint(dir, model.dtype());
    }
  }
};

}  // namespace

namespace {

// Every rank's error text (empty: none); throws on every rank when one
// failed. The failing rank rethrows its own exception; the others name it.
void agree(Comm& comm, const std::exception_ptr& mine, const std::string& what,
           const std::string& dir, const std::function<void()>& cleanup) {
  std::string text;
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const std::exception& e) {
      text = e.what();
    }
    if (text.empty()) text = "unknown error";
  }
  const std::vector<std::string> all = comm.allgather_text(text, what);
  for (int r = 0; r < comm.size(); ++r) {
    if (all[size_t(r)].empty()) continue;
    if (comm.rank() == 0) cleanup();
    if (mine) std::rethrow_exception(mine);
    throw Error(str_of("rank ", r, " could not write its part: ", all[size_t(r)]), dir,
                "nothing was renamed into place; the previous checkpoints are intact");
  }
}

void rename_path(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  TIERMOE_CHECK(!ec, str_of("cannot rename ", from.string(), " to it: ", ec.message()), to.string(),
                "check the directory's permissions and free space");
}

// Renames `tmp` (fsynced) to `target`, replacing it, and fsyncs the parent.
// A directory cannot be renamed over a non-empty one, so an existing target
// is exchanged with tmp by renameat2(RENAME_EXCHANGE), one atomic step:
// `target` names a complete directory at every instant, the old one and
// then the new, and the old one (now under tmp's name) is removed after; a
// kill before that leaves a .tmp that the next run removes (out_dir.h).
// Where the file system cannot exchange, the old directory is renamed aside
// first: a kill between the two renames leaves only .NAME.old-PID, which the
// next run renames back. (A symlink swapped atomically would do as well, but
// then final/ would be a link, which cp -r and rsync copy as a link.)
void move_into_place(const fs::path& tmp, const fs::path& target) {
  for (const auto& entry : fs::recursive_directory_iterator(tmp)) fsync_path(entry.path());
  fsync_path(tmp);
  const fs::path parent = target.parent_path();
  std::error_code ec;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_path(parent);
    fs::remove_all(tmp, ec);
    return;
  }
  const int err = errno;
  if (err == ENOENT) {  // nothing to replace
    rename_path(tmp, target);
    fsync_path(parent);
    return;
  }
  TIERMOE_CHECK(err == EINVAL || err == ENOSYS || err == ENOTSUP,
                str_of("cannot swap ", tmp.string(), " into place: ", std::strerror(err)),
                target.string(), "check the directory's permissions and free space");
  const fs::path old = parent / str_of(".", target.filename().string(), ".old-", ::getpid());
  rename_path(target, old);
  rename_path(tmp, target);
  fsync_path(parent);
  fs::remove_all(old, ec);
}

void write_dir_across_ranks(const std::string& dir,
                            const std::function<void(const std::string&)>& write, Comm& comm) {
  const fs::path target = fs::absolute(dir);
  const fs::path parent = target.parent_path();
  int64_t pid = ::getpid();  // rank 0's names the shared temporary directory
  comm.broadcast(&pid, sizeof pid, 0, "checkpoint directory name");
  const fs::path tmp = parent / str_of(".", target.filename().string(), ".tmp-", pid);
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  };
  auto attempt = [](const std::function<void()>& fn) {
    try {
      fn();
      return std::exception_ptr();
    } catch (...) {
      return std::current_exception();
    }
  };
  std::exception_ptr error;
  if (comm.rank() == 0) {
    error = attempt([&] {
      fs::create_directories(parent);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    });
  }
  agree(comm, error, "checkpoint directory created", dir, cleanup);
  error = attempt([&] { write(tmp.string()); });
  agree(comm, error, "checkpoint parts written", dir, cleanup);
  if (comm.rank() == 0) error = attempt([&] { move_into_place(tmp, target); });
  agree(comm, error, "checkpoint renamed into place", dir, cleanup);
}

}  // namespace

void write_dir_atomically(const std::string& dir,
                          const std::function<void(const std::string&)>& write, Comm* comm) {
  if (comm && comm->size() > 1) {
    write_dir_across_ranks(dir, write, *comm);
    return;
  }
  const fs::path target = fs::absolute(dir);
  const fs::path parent = target.parent_path();
  fs::create_directories(parent);
  const fs::path tmp = parent / str_of(".", target.filename().string(), ".tmp-", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write(tmp.string());
    move_into_place(tmp, target);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

std::vector<std::pair<int64_t, std::string>> list_checkpoint_dirs(const std::string& dir) {
  static const std::regex name(R"(checkpoint-(\d{1,18}))");
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(file, m, name)) {
      out.emplace_back(std::stoll(m[1].str()), entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_checkpoints(const std::string& dir) { return !list_checkpoint_dirs(dir).empty(); }

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / kTrainerStateFile)) return path;
  const auto found = list_checkpoint_dirs(path);
  TIERMOE_CHECK(!found.empty(), "no checkpoint here (no trainer_state.json, no checkpoint-<step>/)",
                path, "pass a checkpoint directory or the --out directory of an earlier run");
  return found.back().second;
}

namespace {

// The first tensor a checkpoint of `trainer` would hold that is not finite,
// as "NAME holds NaN (element i)"; empty when every one is finite. Checked:
// the trainable weights and the optimizer state (fp32 masters included).
// Frozen weights cannot change after loading, and the forward checks them.
std::string first_non_finite_state(const Trainer& trainer) {
  auto check = [](const std::string& name, const Tensor& t) -> std::string {
    const int64_t i = first_non_finite(t);
    if (i < 0) return "";
    return str_of(name, " holds ", t.get(i), " (element ", i, ")");
  };
  for (const Parameter& p : trainer.optimizer().params()) {
    if (std::string bad = check(p.name, p.value); !bad.empty()) return bad;
  }
  for (const auto& [name, t] : trainer.optimizer().state_tensors()) {
    if (std::string bad = check(name, t); !bad.empty()) return bad;
  }
  return "";
}

// Refuses a checkpoint of a non-finite state before anything is written,
// on every rank alike: each rank checks what it holds and the verdicts are
// shared, so no rank writes its part while another refuses.
void check_finite_for_checkpoint(const Trainer& trainer, Comm* comm, const std::string& dir) {
  std::string bad = first_non_finite_state(trainer);
  if (comm && comm->size() > 1) {
    // The first rank's finding, the same text on every rank.
    const std::vector<std::string> all = comm->allgather_text(bad, "checkpoint finite check");
    bad.clear();
    for (int r = 0; r < comm->size() && bad.empty(); ++r) {
      if (!all[size_t(r)].empty()) bad = str_of(all[size_t(r)], " on rank ", r);
    }
  }
  TIERMOE_CHECK(
      bad.empty(),
      str_of("not writing ", fs::path(dir).filename().string(), " at step ", trainer.steps_done(),
             ": ", bad, "; a checkpoint must hold finite weights and optimizer state"),
      dir,
      "the run diverged (lower --lr, or clip with --max-grad-norm); the checkpoints "
      "already written are intact");
}

}  // namespace

std::string save_train_checkpoint(const std::string& out_dir, const CausalLM& model,
                                  const Trainer& trainer, const TrainConfig& config) {
  const std::string dir = (fs::path(out_dir) / checkpoint_dir_name(trainer.steps_done())).string();
  Comm* comm = model.comm();
  const int P = model.ep_ranks(), me = P > 1 ? comm->rank() : 0;
  check_finite_for_checkpoint(trainer, P > 1 ? comm : nullptr, dir);
  const TrainerState state = trainer.state();
  const LrScheduleOptions& lr = trainer.schedule().options();
  json j = {
      {"format", "tiermoe-trainer-state"},
      {"version", 1},
      {"step", state.step},
      {"steps", trainer.options().steps},
      {"weights", config.lora ? "lora" : "full"},
      {"base_model", base_model_name(config)},
      {"rng", {{"seed", config.seed}, {"data", sampler_json(state.data)}}},
      {"lr_schedule",
       {{"kind", lr.kind == LrScheduleKind::cosine ? "cosine" : "constant"},
        {"base_lr", lr.base_lr},
        {"warmup_steps", lr.warmup_steps},
        {"total_steps", lr.total_steps},
        {"min_lr_ratio", lr.min_lr_ratio}}},
      {"config", config.to_json()},
      {"losses", state.losses},
      {"ranks", P},
  };
  const ModelWriter weights(model, config, lora_master_dtype(model.dtype()));
  // The optimizer state of what this rank holds; the replicated parameters'
  // (equal on every rank) only from rank 0.
  OptimizerState optimizer = trainer.optimizer().state_tensors();
  if (me != 0) {
    std::erase_if(optimizer, [](const auto& e) { return hf_expert_index(e.first) < 0; });
  }
  // The routing profile: a resumed run places experts from it at once.
  std::optional<RoutingProfile> profile;
  if (const DeviceTier* tier = model.device_tier()) {
    if (P == 1) {
      profile = tier->profile();
    } else {
      const std::vector<std::string> parts =
          comm->allgather_text(tier->profile().to_json(), "routing profiles");
      std::vector<RoutingProfile> ranks;
      for (const std::string& t : parts) ranks.push_back(RoutingProfile::from_json(t, "rank"));
      profile = RoutingProfile::join(ranks);
    }
  }
  write_dir_atomically(
      dir,
      [&](const std::string& tmp) {
        weights.write(tmp, /*with_config=*/true);
        save_safetensors(
            (fs::path(tmp) / (P == 1 ? kOptimizerStateFile : optimizer_shard_name(me, P))).string(),
            optimizer);
        if (me != 0) return;
        write_text(fs::path(tmp) / kTrainerStateFile, j.dump(1) + "\n");
        if (profile) profile->save((fs::path(tmp) / kRoutingProfileFile).string());
      },
      comm);
  return dir;
}

TrainConfig read_checkpoint_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / kTrainerStateFile;
  const json j = read_json(path);
  TIERMOE_CHECK(j.value("format", "") == "tiermoe-trainer-state", "not a tiermoe trainer state",
                path.string(), "pass a checkpoint directory written by tiermoe train");
  TIERMOE_CHECK(j.contains("config"), "no run config recorded", path.string(),
                "the checkpoint is corrupt");
  return TrainConfig::from_json(j.at("config"), path.string());
}

TrainCheckpoint read_train_checkpoint(const std::string& dir) {
  TrainCheckpoint ck;
  ck.dir = dir;
  ck.config = read_checkpoint_config(dir);
  const fs::path path = fs::path(dir) / kTrainerStateFile;
  const json j = read_json(path);
  try {
    ck.state.step = j.at("step").get<int64_t>();
    ck.state.data = sampler_from_json(j.at("rng").at("data"));
    ck.state.losses = j.at("losses").get<std::vector<double>>();
  } catch (const json::exception& e) {
    throw Error(str_of("malformed trainer state: ", e.what()), path.string(),
                "the checkpoint is corrupt");
  }
  // One file, or one per rank of an expert-parallel run.
  std::vector<fs::path> files;
  if (fs::exists(fs::path(dir) / kOptimizerStateFile)) {
    files.push_back(fs::path(dir) / kOptimizerStateFile);
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (is_optimizer_shard_name(entry.path().filename().string())) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    TIERMOE_CHECK(!files.empty(), "no optimizer state (optimizer.safetensors)", dir,
                  "the checkpoint is incomplete");
    // Every rank's shard, of one count: a missing one is named, not read as
    // state tensors "saved by a different optimizer".
    const int ranks = std::stoi(files[0].filename().string().substr(19, 5));
    for (int r = 0; r < ranks; ++r) {
      const std::string name = optimizer_shard_name(r, ranks);
      TIERMOE_CHECK(fs::exists(fs::path(dir) / name),
                    str_of("optimizer state shard ", name, " is missing"), dir,
                    "the checkpoint is incomplete (every rank of the run writes one); resume from "
                    "an earlier checkpoint or copy the missing file back");
    }
    TIERMOE_CHECK(int(files.size()) == ranks,
                  str_of("optimizer state shards of more than one run (", files.size(),
                         " files, the first one of ", ranks, ")"),
                  dir, "remove the shards that do not belong to this checkpoint");
  }
  for (const fs::path& file : files) {
    const SafetensorsFile f = SafetensorsFile::open(file.string());
    for (const SafetensorsEntry& e : f.entries()) ck.optimizer.emplace_back(e.name, f.view(e.name));
  }
  const fs::path profile = fs::path(dir) / kRoutingProfileFile;
  if (fs::exists(profile)) ck.profile = RoutingProfile::load(profile.string());
  return ck;
}

CausalLM resume_model(const TrainCheckpoint& ck, Comm* comm, ProgressSink progress) {
  if (!ck.config.lora) {
    TrainConfig from = ck.config;
    from.model_dir = ck.dir;
    return build_model(from, comm, progress);
  }
  TrainConfig base = ck.config;
  base.lora_init = ck.dir;
  return build_model(base, comm, progress);
}

OptimizerState optimizer_state_for(const OptimizerState& all, const CausalLM& model) {
  OptimizerState out;
  for (const auto& [name, t] : all) {
    const int64_t e = hf_expert_index(name);
    if (e >= 0 && e < model.config().num_experts && !model.holds_expert(e)) continue;
    out.emplace_back(name, t);
  }
  return out;
}

RoutingProfile profile_for(const RoutingProfile& all, const CausalLM& model,
                           const std::string& source) {
  TIERMOE_CHECK(all.experts() == model.config().num_experts,
                str_of("the routing profile has ", all.experts(), " experts per layer, the model ",
                       model.config().num_experts),
                source, "the profile is of another model");
  if (model.ep_ranks() == 1) return all;
  return all.experts_slice(model.first_expert(), model.local_experts());
}

void export_final(const std::string& dir, const CausalLM& model, const TrainConfig& config) {
  const ModelWriter weights(model, config, DType::f32);
  write_dir_atomically(
      dir, [&](const std::string& tmp) { weights.write(tmp, /*with_config=*/false); },
      model.comm());
}

}  // namespace tiermoe
