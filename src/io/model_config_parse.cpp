// Reading config.json strictly (model_config.h says what is refused), by the
// family's field table (io/families/).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "families/config_io.h"
#include "quant_config.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {

using detail::str_of;
using Json = nlohmann::json;

ModelConfig parse_model_config(std::string_view json_text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw Error(str_of("invalid JSON: ", e.what()), path,
                "config.json must be one JSON object as transformers writes it");
  }
  TIERMOE_CHECK(j.is_object(), str_of("config.json holds ", j.type_name(), ", not an object"), path,
                "config.json must be one JSON object");
  const families::FieldReader f(j, path);
  auto type = f.opt_string("model_type");
  TIERMOE_CHECK(type.has_value(), "config.json has no model_type", path,
                str_of("add \"model_type\": one of ", supported_model_types()));
  const families::FamilyDef* family = families::find_family(*type);
  // A multimodal release (Qwen3.5's qwen3_5_moe) is read as its text model,
  // as transformers' AutoModelForCausalLM reads it.
  const Json* fields = &j;
  if (!family) {
    family = families::find_multimodal_family(*type);
    if (family) {
      fields = f.object("text_config");
      TIERMOE_CHECK(fields, str_of("config.json of model_type '", *type, "' has no text_config"),
                    path,
                    str_of("a ", *type, " config holds its text model's fields under text_config"));
      type = std::string(family->spec.model_type);
    }
  }
  TIERMOE_CHECK(family, str_of("unsupported model_type '", *type, "'"), path,
                str_of("TierMoE supports model_type ", supported_model_types()));
  ModelConfig c;
  c.model_type = *type;
  c.family = family->spec.family;
  families::read_config(*family, *fields, path, c);
  if (const Json* q = f.object("quantization_config")) parse_quantization_config(*q, path, c);
  c.validate(path);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  require_regular_file(p.string(), "config.json",
                       "a checkpoint directory holds config.json next to its safetensors files");
  // Real configs are a few KB; a huge file is refused before it is read.
  constexpr uintmax_t kMaxConfigBytes = uintmax_t(16) << 20;
  const uintmax_t size = std::filesystem::file_size(p);
  TIERMOE_CHECK(
      size <= kMaxConfigBytes,
      str_of("config.json is ", size, " bytes, above the ", kMaxConfigBytes, " TierMoE reads"),
      p.string(), "a model's config.json is a few KB: is this the right file?");
  std::ifstream in(p, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot open config.json", p.string(),
                "a checkpoint directory holds config.json next to its safetensors files");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), p.string());
}

}  // namespace tiermoe
