#include "tiermoe/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "tiermoe/core/error.h"
#include "tiermoe/io/safetensors.h"

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

// Steps of the checkpoint-<N> directories under `dir`, as (N, path).
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  static const std::regex name(R"(checkpoint-(\d{1,18}))");
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(file, m, name)) {
      out.emplace_back(std::stoll(m[1].str()), entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  TIERMOE_CHECK(out.good(), "cannot write file", path.string(), "check free disk space");
}

json read_json(const fs::path& path) {
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

std::string base_model_name(const TrainConfig& c) {
  return c.model_dir.empty() ? str_of("tiermoe preset ", c.preset, " seed ", c.seed) : c.model_dir;
}

}  // namespace

void write_dir_atomically(const std::string& dir,
                          const std::function<void(const std::string&)>& write) {
  const fs::path target = fs::absolute(dir);
  const fs::path parent = target.parent_path();
  fs::create_directories(parent);
  const fs::path tmp = parent / str_of(".", target.filename().string(), ".tmp-", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write(tmp.string());
    for (const auto& entry : fs::recursive_directory_iterator(tmp)) fsync_path(entry.path());
    fsync_path(tmp);
    // A directory cannot be renamed over a non-empty one: move the old one
    // aside first, so `dir` names either the old or the new, never a mix.
    const fs::path old = parent / str_of(".", target.filename().string(), ".old-", ::getpid());
    const bool replace = fs::exists(target);
    if (replace) fs::rename(target, old);
    fs::rename(tmp, target);
    fsync_path(parent);
    if (replace) fs::remove_all(old);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

bool has_checkpoints(const std::string& dir) { return !list_checkpoints(dir).empty(); }

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / kTrainerStateFile)) return path;
  const auto found = list_checkpoints(path);
  TIERMOE_CHECK(!found.empty(), "no checkpoint here (no trainer_state.json, no checkpoint-<step>/)",
                path, "pass a checkpoint directory or the --out directory of an earlier run");
  return found.back().second.string();
}

std::string save_train_checkpoint(const std::string& out_dir, const CausalLM& model,
                                  const Trainer& trainer, const TrainConfig& config) {
  const std::string dir = (fs::path(out_dir) / checkpoint_dir_name(trainer.steps_done())).string();
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
  };
  write_dir_atomically(dir, [&](const std::string& tmp) {
    if (config.lora) {
      model.save_lora_adapter(tmp, lora_master_dtype(model.dtype()), base_model_name(config));
      save_model_config(model.config(), (fs::path(tmp) / "config.json").string());
    } else {
      model.save_checkpoint(tmp, model.dtype());
    }
    save_safetensors((fs::path(tmp) / kOptimizerStateFile).string(),
                     trainer.optimizer().state_tensors());
    write_text(fs::path(tmp) / kTrainerStateFile, j.dump(1) + "\n");
    // The routing profile: a resumed run places experts from it at once.
    if (const DeviceTier* tier = model.device_tier()) {
      tier->profile().save((fs::path(tmp) / kRoutingProfileFile).string());
    }
  });
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
  const SafetensorsFile f = SafetensorsFile::open((fs::path(dir) / kOptimizerStateFile).string());
  for (const SafetensorsEntry& e : f.entries()) ck.optimizer.emplace_back(e.name, f.view(e.name));
  const fs::path profile = fs::path(dir) / kRoutingProfileFile;
  if (fs::exists(profile)) ck.profile = RoutingProfile::load(profile.string());
  return ck;
}

CausalLM resume_model(const TrainCheckpoint& ck) {
  if (!ck.config.lora) {
    TrainConfig from = ck.config;
    from.model_dir = ck.dir;
    return build_model(from);
  }
  TrainConfig base = ck.config;
  base.lora_init = ck.dir;
  return build_model(base);
}

void export_final(const std::string& dir, const CausalLM& model, const TrainConfig& config) {
  write_dir_atomically(dir, [&](const std::string& tmp) {
    if (config.lora) {
      model.save_lora_adapter(tmp, DType::f32, base_model_name(config));
    } else {
      model.save_checkpoint(tmp, model.dtype());
    }
  });
}

}  // namespace tiermoe
