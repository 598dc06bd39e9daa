#include "quant_config.h"

#include "tiermoe/core/error.h"

namespace tiermoe {

namespace {

using Json = nlohmann::json;
using detail::str_of;

// q[key] as a string, "" when absent or null.
std::string string_at(const Json& q, const char* key) {
  return q.contains(key) && q.at(key).is_string() ? q.at(key).get<std::string>() : "";
}

void parse_fp8(const Json& q, const std::string& path) {
  const std::string hint =
      "TierMoE reads block FP8 as DeepSeek-V3 ships it: {\"quant_method\": \"fp8\", \"fmt\": "
      "\"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}";
  const std::string fmt = string_at(q, "fmt");
  // DeepSeek writes "e4m3", MiniMax torch's name for the same format.
  TIERMOE_CHECK(fmt.empty() || fmt == "e4m3" || fmt == "float8_e4m3fn",
                str_of("quantization_config.fmt is '", fmt, "'"), path, hint);
  const std::string act = string_at(q, "activation_scheme");
  TIERMOE_CHECK(act.empty() || act == "dynamic",
                str_of("quantization_config.activation_scheme is '", act,
                       "' (static input scales are not read)"),
                path, hint);
  const Json* block = q.contains("weight_block_size") ? &q.at("weight_block_size") : nullptr;
  TIERMOE_CHECK(block && *block == Json::array({128, 128}),
                str_of("quantization_config.weight_block_size is ",
                       block ? block->dump() : std::string("absent")),
                path, hint);
}

void parse_compressed_tensors(const Json& q, const std::string& path, ModelConfig& c) {
  const std::string hint =
      "TierMoE reads compressed-tensors' weight-only symmetric int4/int8 schemes (W4A16, W8A16: "
      "format pack-quantized or int-quantized, type int, strategy group or channel), as "
      "llm-compressor writes them";
  const std::string format = string_at(q, "format");
  TIERMOE_CHECK(
      format == "pack-quantized" || format == "int-quantized" || format == "naive-quantized",
      str_of("quantization_config.format is '", format, "'"), path, hint);
  const std::string status = string_at(q, "quantization_status");
  TIERMOE_CHECK(status.empty() || status == "compressed",
                str_of("quantization_config.quantization_status is '", status, "'"), path,
                "a checkpoint as saved by llm-compressor says \"compressed\"");
  TIERMOE_CHECK(q.contains("config_groups") && q.at("config_groups").is_object() &&
                    !q.at("config_groups").empty(),
                "quantization_config has no config_groups", path, hint);
  for (const auto& [name, group] : q.at("config_groups").items()) {
    const std::string where = "quantization_config.config_groups." + name;
    TIERMOE_CHECK(group.is_object() && group.contains("weights") && group.at("weights").is_object(),
                  where + " has no weights scheme", path, hint);
    for (const char* acts : {"input_activations", "output_activations"}) {
      TIERMOE_CHECK(!group.contains(acts) || group.at(acts).is_null(),
                    str_of(where, ".", acts, " quantizes activations"), path,
                    "TierMoE trains over quantized weights only (W4A16, W8A16); its activations "
                    "stay in the compute dtype");
    }
    const Json& w = group.at("weights");
    const int bits = w.value("num_bits", 0);
    const std::string type = string_at(w, "type"), strategy = string_at(w, "strategy");
    const bool symmetric = w.value("symmetric", false), dynamic = w.value("dynamic", false);
    const std::string actorder = string_at(w, "actorder");
    TIERMOE_CHECK((bits == 4 || bits == 8) && type == "int" && symmetric && !dynamic &&
                      (strategy == "group" || strategy == "channel") &&
                      (actorder.empty() || actorder == "static") &&
                      (bits == 8 || format != "int-quantized"),
                  str_of(where, ".weights is ", w.dump()), path, hint);
    const int64_t group_size =
        strategy == "group" && w.contains("group_size") && w.at("group_size").is_number_integer()
            ? w.at("group_size").get<int64_t>()
            : 0;
    TIERMOE_CHECK(strategy == "channel" || group_size > 0,
                  str_of(where, ".weights.group_size is ",
                         w.contains("group_size") ? w.at("group_size").dump() : "absent"),
                  path, "a group strategy names its positive group_size");
    TIERMOE_CHECK(c.quant_bits == 0 || (c.quant_bits == bits && c.quant_group == group_size),
                  str_of(where, " has ", bits, " bits, group ", group_size, "; another group has ",
                         c.quant_bits, ", ", c.quant_group),
                  path, "TierMoE reads checkpoints whose quantized matrices share one scheme");
    c.quant_bits = bits;
    c.quant_group = group_size;
  }
}

}  // namespace

void parse_quantization_config(const Json& q, const std::string& path, ModelConfig& c) {
  c.quant_method = string_at(q, "quant_method");
  if (c.quant_method == "mxfp4") {
    TIERMOE_CHECK(c.spec().shipped_experts == "mxfp4",
                  str_of("quantization_config asks for mxfp4 on ", c.model_type), path,
                  "MXFP4 checkpoints are gpt-oss's (its experts' _blocks and _scales)");
    return;
  }
  if (c.quant_method == "fp8") return parse_fp8(q, path);
  if (c.quant_method == "compressed-tensors") return parse_compressed_tensors(q, path, c);
  throw Error(str_of("quantization_config asks for quant_method '", c.quant_method, "'"), path,
              "TierMoE reads gpt-oss's MXFP4, block FP8 (fp8) and compressed-tensors' int4/int8; "
              "dequantize others first (e.g. transformers' dequantize=True)");
}

}  // namespace tiermoe
