// `sparkserve_scripted serve-scripted --script FILE <serve options>`: the real server (HTTP layer,
// engine, scheduler, sampler, detokenizer, output parsers) on a fake model runner that, after any
// prompt, writes the tokens of FILE's text and then the tokenizer's EOS. The server tests use it to
// exercise the reasoning / tool-call parsers and stop strings, which random weights never reach.
// Test-only: built from tests/, never part of the sparkserve binary.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/command.h"
#include "cli/serve.h"
#include "runtime/sequence.h"
#include "text/tokenizer.h"

namespace sparkserve::cli {
namespace {

// Sequence with n generated tokens -> script[n], then EOS; one row per chunk that asks for logits
// (the chosen id gets logit 30, every other 0: greedy and sampled requests alike take it). A greedy
// row the engine needs only the choice of (argmax_vocab, nothing excluded, no draw) comes back as
// that id alone, as the model runners send it back, so the host does not sample a full row.
class ScriptedRunner final : public ModelRunner {
 public:
  ScriptedRunner(std::vector<int32_t> script, int32_t eos, int64_t vocab, CacheGeometry g)
      : script_(std::move(script)), eos_(eos), vocab_(vocab), geometry_(g) {}
  CacheGeometry geometry() const override { return geometry_; }
  Expected<StepOutput> execute(const StepPlan& plan) override {
    StepOutput out;
    Logits& l = out.logits;
    l.vocab = vocab_;
    bool any_argmax_only = false;
    int64_t value_rows = 0;
    for (const ScheduledChunk& c : plan.chunks) {
      for (int64_t r = 0; r < c.num_logits; ++r) {
        // Row r predicts the token after position start_pos + tokens.size() - num_logits + r.
        const int64_t generated = c.start_pos + static_cast<int64_t>(c.tokens.size()) - c.num_logits + r + 1 -
                                  c.seq->prompt_len;
        const int32_t next = generated < static_cast<int64_t>(script_.size()) ? script_[static_cast<size_t>(generated)] : eos_;
        const bool argmax_only =
            next < c.argmax_vocab && c.argmax_excluded.empty() && c.draw.temperature == 0.0f;
        any_argmax_only = any_argmax_only || argmax_only;
        l.argmax.push_back(RowArgmax{next, -1});
        l.data_row.push_back(argmax_only ? -1 : value_rows);
        ++l.rows;
        if (argmax_only) continue;
        ++value_rows;
        l.data.resize(l.data.size() + static_cast<size_t>(vocab_), 0.0f);
        l.data[l.data.size() - static_cast<size_t>(vocab_) + static_cast<size_t>(next)] = 30.0f;
      }
    }
    if (!any_argmax_only) {  // every row whole: the plain form
      l.argmax.clear();
      l.data_row.clear();
    }
    return out;
  }

 private:
  std::vector<int32_t> script_;
  int32_t eos_;
  int64_t vocab_;
  CacheGeometry geometry_;
};

void register_serve_scripted(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<ServeOptions>();
  auto script_file = std::make_shared<std::string>();
  auto* cmd = root.add_subcommand("serve-scripted", "serve, on a fake model that writes --script's text");
  add_serve_options(cmd, *o);
  cmd->add_option("--script", *script_file, "text every request generates")->required();
  cmd->callback([o, script_file, &exit_code] {
    exit_code = run_serve(*o, [&](const ServeOptions& opts, const ModelConfig& config, const StateLimits& limits)
                                  -> Expected<std::unique_ptr<ModelRunner>> {
      std::ifstream in(*script_file, std::ios::binary);
      if (!in) return make_error("cannot read " + *script_file);
      std::stringstream text;
      text << in.rdbuf();
      SS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(opts.model));
      SS_ASSIGN_OR_RETURN(auto ids, tok.encode(text.str()));
      auto eos = tok.eos_token_id();
      if (!eos) return make_error("the tokenizer has no eos token");
      return std::unique_ptr<ModelRunner>(std::make_unique<ScriptedRunner>(
          std::vector<int32_t>(ids.begin(), ids.end()), *eos, config.vocab_size,
          CacheGeometry{limits.num_kv_blocks, limits.block_size, limits.max_sequences, limits.num_snapshots}));
    });
  });
}
SPARKSERVE_COMMAND(register_serve_scripted);

}  // namespace
}  // namespace sparkserve::cli
