#include "loader/weights.h"

#include <cmath>
#include <cstring>
#include <set>

#include "core/nvfp4.h"
#include "core/tensor.h"
#include "loader/load_progress.h"
#include "loader/quant_config.h"
#include "loader/quant_scheme.h"
#include "loader/weight_layout.h"
#include "loader/weight_stream.h"

namespace sparkserve {

std::vector<std::string> LoadReport::notes() const {
  std::vector<std::string> out;
  if (visual_tensors > 0)
    out.push_back("note: " + std::to_string(visual_tensors) +
                  " vision tower tensors (model.visual.*) unused: config.json has no vision_config (text-only model)");
  if (mtp_tensors > 0)
    out.push_back("note: " + std::to_string(mtp_tensors) +
                  " multi-token-prediction tensors (mtp.*) not loaded (used for speculative decoding: "
                  "--speculative-tokens K)");
  for (const auto& name : unexpected)
    out.push_back("warning: checkpoint tensor '" + name + "' is not used by the model");
  for (const auto& line : quant_warnings) out.push_back("warning: " + line);
  for (const auto& [name, n] : nonfinite)
    out.push_back("warning: checkpoint tensor '" + name + "' holds " + std::to_string(n) +
                  " non-finite values (NaN or Inf): the model's output will be garbage or fail");
  return out;
}

namespace {

using Part = WeightPart;

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ckpt, const QuantPlan& plan, Backend& backend, WeightStream& stream, ModelWeights& w)
      : ckpt_(ckpt), plan_(plan), backend_(backend), stream_(stream), w_(w) {}

  std::set<std::string>& used() { return used_; }
  const TensorInfo* find(const std::string& name) const { return ckpt_.find(name); }

  // The tensor, checked for presence, shape and a float dtype.
  Expected<const TensorInfo*> require(const Part& p) {
    const TensorInfo* info = ckpt_.find(p.name);
    if (!info)
      return make_error(ckpt_.dir().string() + ": tensor '" + p.name +
                        "' is missing (config.json needs it, expected shape " + shape_to_string(p.shape) + ")");
    if (info->shape != p.shape)
      return make_error(info->file.string() + ": tensor '" + p.name + "' has shape " +
                        shape_to_string(info->shape) + ", expected " + shape_to_string(p.shape) +
                        " from config.json");
    if (!is_float_dtype(info->dtype))
      return make_error(info->file.string() + ": tensor '" + p.name + "' has dtype " +
                        std::string(dtype_name(info->dtype)) + ", expected F32, BF16 or F16" +
                        (info->dtype == DType::kF8E4M3 || info->dtype == DType::kU8
                             ? " (quantized checkpoints are not supported yet)"
                             : ""));
    used_.insert(p.name);
    return info;
  }

  // A small tensor (norm weight, conv kernel, A_log, ...) converted to f32.
  Expected<Tensor> vector_f32(const Part& p, std::vector<int64_t> device_shape = {}) {
    SS_ASSIGN_OR_RETURN(const TensorInfo* info, require(p));
    w_.storage.emplace_back(&backend_, DType::kF32, device_shape.empty() ? p.shape : device_shape);
    SS_RETURN_IF_ERROR(stream_.convert_f32(*info, w_.storage.back().tensor(), 0));
    return w_.storage.back().tensor();
  }

  // Concatenates the parts along their first dim into one matrix weight of `shape` (out/in
  // features describe one expert for stacked [E, out, in] weights). BF16 and F32 stay as stored
  // when every part agrees; anything else (F16, mixed dtypes) becomes F32.
  Expected<Linear> matrix(const std::vector<Part>& parts, std::vector<int64_t> shape, bool allow_quantized = true) {
    std::vector<const ModuleFormat*> modules;
    bool any_quantized = false;
    for (const Part& p : parts) {
      const ModuleFormat* m = plan_.find(split_module_role(p.name).first);
      modules.push_back(m);
      if (m && is_quantized(m->format)) any_quantized = true;
    }
    if (any_quantized) {
      if (!allow_quantized)
        return make_error(ckpt_.dir().string() + ": module '" + split_module_role(parts[0].name).first +
                          "' is stored " + std::string(weight_format_name(modules[0]->format)) +
                          ", but this weight must be BF16/F16/F32 (quantized embeddings are not supported)");
      return quantized_matrix(parts, modules, shape);
    }
    std::vector<const TensorInfo*> infos;
    for (const Part& p : parts) {
      SS_ASSIGN_OR_RETURN(const TensorInfo* info, require(p));
      infos.push_back(info);
    }
    DType dtype = infos[0]->dtype;
    for (const TensorInfo* i : infos)
      if (i->dtype != dtype) dtype = DType::kF32;
    if (dtype == DType::kF16) dtype = DType::kF32;
    Linear lin;
    lin.format = dtype == DType::kBF16 ? WeightFormat::kBf16 : WeightFormat::kF32;
    lin.out_features = shape[shape.size() - 2];
    lin.in_features = shape.back();
    w_.storage.emplace_back(&backend_, dtype, shape);
    lin.weight = w_.storage.back().tensor();
    // Streamed part by part, piece by piece, straight into place (no whole-weight host copy).
    size_t offset = 0;
    for (const TensorInfo* info : infos) {
      const size_t bytes = static_cast<size_t>(info->numel()) * dtype_size(dtype);
      if (offset + bytes > lin.weight.nbytes())
        return make_error(info->file.string() + ": tensor '" + info->name + "' does not fit the weight");
      if (info->dtype == dtype) {
        SS_RETURN_IF_ERROR(stream_.copy(*info, lin.weight, offset));
      } else {
        SS_RETURN_IF_ERROR(stream_.convert_f32(*info, lin.weight, offset / sizeof(float)));
      }
      offset += bytes;
    }
    CHECK(offset == lin.weight.nbytes());
    return lin;
  }

  Expected<Linear> linear(const std::string& name, int64_t out, int64_t in, bool allow_quantized = true) {
    return matrix({{name, {out, in}}}, {out, in}, allow_quantized);
  }

 private:
  // Quantized parts (each one checkpoint module [n, K]) stacked into one Linear of `shape`
  // ([N, K] or [E, N, K]); each part keeps its own global / input scale (Linear::partitions).
  Expected<Linear> quantized_matrix(const std::vector<Part>& parts, const std::vector<const ModuleFormat*>& modules,
                                    const std::vector<int64_t>& shape) {
    const std::string where = ckpt_.dir().string() + ": module '";
    const ModuleFormat* first = modules[0];
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string mod = split_module_role(parts[i].name).first;
      const ModuleFormat* m = modules[i];
      if (!m)
        return make_error(where + mod + "' is missing (config.json needs it, expected shape " +
                          shape_to_string(parts[i].shape) + ")");
      if (m->format != first->format || m->activation != first->activation)
        return make_error(where + mod + "' is " + std::string(weight_format_name(m->format)) + " (activations " +
                          std::string(activation_quant_name(m->activation)) + ") but '" + first->name + "' is " +
                          std::string(weight_format_name(first->format)) + " (activations " +
                          std::string(activation_quant_name(first->activation)) +
                          "): they form one weight here and must share a format");
      if (parts[i].shape.size() != 2 || m->shape != parts[i].shape)
        return make_error(where + mod + "' has shape " + shape_to_string(m->shape) + ", expected " +
                          shape_to_string(parts[i].shape) + " from config.json" +
                          (parts[i].shape.size() != 2 ? " (quantized fused 3-D experts are not supported)" : ""));
      if (parts[i].shape[0] != parts[0].shape[0])
        return make_error(where + mod + "': quantized parts of one weight must have equal row counts");
    }
    const WeightFormat fmt = first->format;
    // Until a device backend implements the quantized kernels, refuse instead of failing inside one.
    if (backend_.device() != Device::kCpu && backend_.device() != Device::kCuda)
      return make_error(where + first->name + "' is " + std::string(weight_format_name(fmt)) + ": the " +
                        backend_.name() + " backend does not run quantized weights yet (use --device cpu)");
    const QuantizedShape q(fmt, shape, static_cast<int64_t>(parts.size()));
    const bool nvfp4 = q.nvfp4;
    const int64_t E = q.E, K = q.K, num_parts = q.parts;
    if (!q.tiles(parts[0].shape[0]))
      return make_error(where + first->name + "': parts do not tile the weight");  // a caller bug, reported
    if (nvfp4 && K % kNvfp4BlockSize != 0)
      return make_error(where + first->name + "': NVFP4 needs in_features divisible by 16, got " + std::to_string(K));
    const int64_t rows = parts[0].shape[0];
    Linear lin = q.linear(fmt, first->activation);
    const int64_t wcols = q.code_cols();
    // Weights and per-row / per-block scales stream into their backend tensors part by part; only
    // the per-part global / input scales (a few floats per part) are gathered on the host.
    lin.weight = alloc(nvfp4 ? DType::kU8 : DType::kF8E4M3, q.code_dims());
    lin.weight_scale = nvfp4 ? alloc(DType::kF8E4M3, q.block_scale_dims()) : alloc(DType::kF32, q.row_scale_dims());
    std::vector<float> global(static_cast<size_t>(num_parts), 1.0f), input(static_cast<size_t>(num_parts), 1.0f);
    const bool needs_input = lin.activation == ActivationQuant::kNvfp4 || lin.activation == ActivationQuant::kFp8TensorStatic;
    for (int64_t i = 0; i < num_parts; ++i) {
      const ModuleFormat& m = *modules[static_cast<size_t>(i)];
      const ModuleTensors& t = m.tensors;
      auto fail = [&](const std::string& why) { return make_error(where + m.name + "': " + why); };
      if (!t.weight) return fail("has no weight tensor");
      if (!t.weight_scale) return fail("has no weight_scale tensor (a quantized weight needs its scales)");
      const int64_t row0 = i * rows;  // rows of all parts are stacked in order, experts included
      if (t.weight->nbytes != static_cast<uint64_t>(rows * wcols))
        return fail("tensor '" + t.weight->name + "' holds " + std::to_string(t.weight->nbytes) + " bytes, expected " +
                    std::to_string(rows * wcols));
      SS_RETURN_IF_ERROR(stream_.copy(*t.weight, lin.weight, static_cast<uint64_t>(row0 * wcols)));
      if (nvfp4) {
        const int64_t nb = rows * (K / kNvfp4BlockSize);
        if (t.weight_scale->dtype != DType::kF8E4M3 || t.weight_scale->numel() != nb)
          return fail("tensor '" + t.weight_scale->name + "' must be F8_E4M3 with " + std::to_string(nb) +
                      " values, got " + std::string(dtype_name(t.weight_scale->dtype)) + " " +
                      shape_to_string(t.weight_scale->shape));
        SS_RETURN_IF_ERROR(stream_.copy(*t.weight_scale, lin.weight_scale,
                                        static_cast<uint64_t>(row0 * (K / kNvfp4BlockSize)),
                                        [&](const uint8_t* b, uint64_t n, uint64_t) -> Status {
                                          for (uint64_t j = 0; j < n; ++j)
                                            if ((b[j] & 0x7F) == 0x7F)
                                              return fail("tensor '" + t.weight_scale->name +
                                                          "' holds a NaN block scale");
                                          return Status::Ok();
                                        }));
        if (!t.global_scale)
          return fail(std::string("has no ") + (fmt == WeightFormat::kNvfp4 ? "weight_global_scale" : "weight_scale_2") +
                      " tensor");
        SS_ASSIGN_OR_RETURN(float g, scalar(*t.global_scale, m.name));
        global[static_cast<size_t>(i)] = g;
      } else {
        const int64_t count = t.weight_scale->numel();
        if (count != 1 && count != rows)
          return fail("tensor '" + t.weight_scale->name + "' has " + std::to_string(count) +
                      " values, expected 1 (per tensor) or " + std::to_string(rows) + " (per channel)");
        auto finite = [&](const float* v, uint64_t n, uint64_t) -> Status {
          for (uint64_t j = 0; j < n; ++j)
            if (!std::isfinite(v[j])) return fail("tensor '" + t.weight_scale->name + "' holds a non-finite scale");
          return Status::Ok();
        };
        if (count == rows) {
          SS_RETURN_IF_ERROR(stream_.convert_f32(*t.weight_scale, lin.weight_scale, static_cast<uint64_t>(row0), finite));
        } else {
          // A per-tensor scale is repeated over the part's rows (same products as one scale).
          SS_ASSIGN_OR_RETURN(std::vector<float> ws, stream_.read_small_f32(*t.weight_scale));
          SS_RETURN_IF_ERROR(finite(ws.data(), 1, 0));
          stream_.fill_f32(lin.weight_scale, static_cast<uint64_t>(row0), static_cast<uint64_t>(rows), ws[0]);
        }
      }
      if (needs_input) {
        if (!t.input_scale)
          return fail(std::string("has no ") + (fmt == WeightFormat::kNvfp4 ? "input_global_scale" : "input_scale") +
                      " tensor (its activations are quantized with a static scale)");
        SS_ASSIGN_OR_RETURN(float s, scalar(*t.input_scale, m.name));
        input[static_cast<size_t>(i)] = s;
      }
      for (const TensorInfo* ti : {t.weight, t.weight_scale, t.global_scale, t.input_scale})
        if (ti) used_.insert(ti->name);
    }
    if (nvfp4) lin.global_scale = upload(DType::kF32, {E, lin.partitions}, global.data());
    if (needs_input) lin.input_scale = upload(DType::kF32, {E, lin.partitions}, input.data());
    return lin;
  }

  // A one-value scale tensor, which must be finite and positive (it divides or multiplies every value).
  Expected<float> scalar(const TensorInfo& info, const std::string& module) {
    if (info.numel() != 1)
      return make_error(info.file.string() + ": tensor '" + info.name + "' of module '" + module + "' has shape " +
                        shape_to_string(info.shape) + ", expected one value");
    SS_ASSIGN_OR_RETURN(std::vector<float> v, stream_.read_small_f32(info));
    if (!std::isfinite(v[0]) || v[0] <= 0.0f)
      return make_error(info.file.string() + ": tensor '" + info.name + "' of module '" + module + "' is " +
                        std::to_string(v[0]) + ", expected a finite positive scale");
    return v[0];
  }

  Tensor upload(DType dtype, std::vector<int64_t> shape, const void* host) {
    w_.storage.emplace_back(&backend_, dtype, std::move(shape));
    backend_.upload(w_.storage.back().tensor(), host);
    return w_.storage.back().tensor();
  }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) {
    w_.storage.emplace_back(&backend_, dtype, std::move(shape));
    return w_.storage.back().tensor();
  }

  const Checkpoint& ckpt_;
  const QuantPlan& plan_;
  Backend& backend_;
  WeightStream& stream_;
  ModelWeights& w_;
  std::set<std::string> used_;
};

bool has_quantized_tensors(const Checkpoint& ckpt) {
  for (const auto& [name, info] : ckpt.tensors()) {
    if (info.dtype == DType::kU8 || info.dtype == DType::kF8E4M3 || info.dtype == DType::kF8E5M2) return true;
    const std::string role = split_module_role(name).second;
    if (role == "weight_packed" || role == "weight_scale" || role == "weight_global_scale" ||
        role == "input_global_scale" || role == "weight_scale_2" || role == "input_scale")
      return true;
  }
  return false;
}

}  // namespace

namespace {
Expected<ModelWeights> load_weights_streamed(const Checkpoint& ckpt, const ModelConfig& c, Backend& backend,
                                             WeightStream& stream, bool load_mtp) {
  ModelWeights w;
  // Every module's format is decided from its tensors and checked against the quantization config
  // first: a module with no consistent reading fails the load here, by name.
  SS_ASSIGN_OR_RETURN(QuantConfig quant_config, load_quant_config(ckpt.dir()));
  auto plan = plan_module_formats(ckpt.tensors(), quant_config);
  if (!plan.ok()) {
    // A plain checkpoint (no quantization config, no quantized tensor) keeps the per-tensor
    // messages below ("tensor 'x' has dtype I32, expected F32, BF16 or F16"), which name the file.
    if (quant_config.method != QuantMethod::kNone || has_quantized_tensors(ckpt))
      return make_error(ckpt.dir().string() + ": " + plan.message());
    plan = QuantPlan{};
  }
  w.report.quant_warnings = plan->warnings;
  WeightLoader L(ckpt, *plan, backend, stream, w);
  std::string prefix;
  if (ckpt.find("model.language_model.embed_tokens.weight")) {
    prefix = "model.language_model.";
  } else if (ckpt.find("model.embed_tokens.weight")) {
    prefix = "model.";
  } else {
    return make_error(ckpt.dir().string() +
                      ": tensor 'model.language_model.embed_tokens.weight' (or 'model.embed_tokens.weight') "
                      "is missing: not a Qwen3.5 checkpoint?");
  }
  w.report.prefix = prefix;
  if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers)
    return make_error("config.json: layer_types has " + std::to_string(c.layer_types.size()) +
                      " entries for num_hidden_layers " + std::to_string(c.num_hidden_layers));
  SS_RETURN_IF_ERROR(weight_layout::text_model(L, c, prefix, w));
  if (c.tie_word_embeddings && ckpt.find("lm_head.weight")) L.used().insert("lm_head.weight");  // a saved copy of the tie
  // The vision tower, where the config has one and the checkpoint holds it (`synth --no-vision`
  // writes checkpoints without it: those serve text only).
  for (const char* vp : {"model.visual.", "visual."})
    if (c.vision.present && ckpt.find(std::string(vp) + "patch_embed.proj.weight")) {
      SS_RETURN_IF_ERROR(weight_layout::vision(L, c.vision, vp, w.vision));
      break;
    }
  if (load_mtp) {
    if (!ckpt.find("mtp.fc.weight"))
      return make_error(ckpt.dir().string() +
                        ": speculative decoding needs the multi-token-prediction layer, but the checkpoint has no "
                        "'mtp.fc.weight' (no mtp.* tensors)");
    SS_RETURN_IF_ERROR(weight_layout::mtp(L, c, w.mtp));
  }
  for (const auto& [name, info] : ckpt.tensors()) {
    if (L.used().count(name)) continue;
    if (name.rfind("model.visual.", 0) == 0 || name.rfind("visual.", 0) == 0) {
      ++w.report.visual_tensors;
    } else if (name.rfind("mtp.", 0) == 0) {
      ++w.report.mtp_tensors;
    } else {
      w.report.unexpected.push_back(name);
    }
  }
  w.report.nonfinite = stream.nonfinite_tensors();
  return w;
}
}  // namespace

uint64_t text_model_bytes(const Checkpoint& ckpt, bool with_vision, bool with_mtp) {
  uint64_t total = 0;
  for (const auto& [name, info] : ckpt.tensors()) {
    const bool visual = name.rfind("model.visual.", 0) == 0 || name.rfind("visual.", 0) == 0;
    const bool mtp = name.rfind("mtp.", 0) == 0;
    if ((with_vision || !visual) && (with_mtp || !mtp)) total += info.nbytes;
  }
  return total;
}

Expected<ModelWeights> load_weights(const Checkpoint& ckpt, const ModelConfig& c, Backend& backend,
                                    const LoadOptions& options) {
  if (options.buffer_bytes < kMinLoadBuffer)
    return make_error("load buffer of " + format_bytes(options.buffer_bytes) + " is below the minimum of " +
                      format_bytes(kMinLoadBuffer));
  WeightStream stream(ckpt, backend, options);
  if (options.progress) options.progress->start(text_model_bytes(ckpt, c.vision.present, options.load_mtp));
  auto w = load_weights_streamed(ckpt, c, backend, stream, options.load_mtp);
  backend.synchronize();
  // Folios that straddled two tensors (each dropped only its own whole pages) go now.
  if (options.drop_page_cache) ckpt.drop_cached_files();
  if (options.progress) options.progress->finish(w.ok());
  if (w.ok()) {
    w->report.bytes_read = stream.bytes_read();
    w->report.peak_staging_bytes = stream.peak_staging_bytes();
  }
  return w;
}

}  // namespace sparkserve
