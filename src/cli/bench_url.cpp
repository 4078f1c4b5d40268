#include "cli/bench_url.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "core/status.h"

namespace sparkserve::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Common words: prompts of random words tokenize to about one token each with any BPE vocabulary,
// and random order keeps a server's prefix cache from serving a later request.
constexpr const char* kWords[] = {
    "time",  "year",  "people", "way",    "day",   "man",    "thing",  "woman", "life",  "child", "world", "school",
    "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case",  "week",  "company",
    "system", "program", "question", "work", "government", "number", "night", "point", "home", "water", "room",
    "mother", "area",  "money", "story",  "fact",  "month",  "lot",    "right", "study", "book",  "eye",   "job",
    "word",  "business", "issue", "side", "kind",  "head",   "house",  "service", "friend", "father", "power",
    "hour",  "game",  "line",  "end",    "member", "law",   "car",    "city",  "name",  "president", "team",
    "minute", "idea", "kid",   "body",   "information", "back", "parent", "face", "others", "level", "office",
    "door",  "health", "person", "art",  "war",   "history", "party", "result", "change", "morning", "reason",
    "research", "girl", "guy", "moment", "air",   "teacher", "force", "education"};

struct Endpoint {
  std::string scheme_host_port;  // http://host:port
  std::string base;              // path prefix before /v1 (usually empty)
};

Expected<Endpoint> parse_url(std::string url) {
  if (url.rfind("https://", 0) == 0)
    return make_error("--url " + url + ": https is not supported by this build (cpp-httplib without OpenSSL); use http://");
  if (url.rfind("http://", 0) != 0) return make_error("--url " + url + ": expected http://host:port[/v1]");
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t slash = url.find('/', 7);
  Endpoint e;
  e.scheme_host_port = url.substr(0, slash);
  e.base = slash == std::string::npos ? "" : url.substr(slash);
  if (e.base.size() >= 3 && e.base.compare(e.base.size() - 3, 3, "/v1") == 0) e.base.resize(e.base.size() - 3);
  if (e.scheme_host_port.size() <= 7) return make_error("--url " + url + ": no host");
  return e;
}

struct RunResult {
  double ttfr_s = 0, e2e_ttft_s = 0, t_first_token = 0, t_end = 0;
  int64_t prompt_tokens = 0;
  int64_t gen_tokens = 0;
  std::string token_source;  // "token_ids", "usage", "chunks"
};

class BenchClient {
 public:
  BenchClient(const Endpoint& e, const BenchUrlOptions& o, uint32_t seed = 20261130)
      : e_(e), o_(o), cli_(e.scheme_host_port), rng_(seed) {
    cli_.set_connection_timeout(5);
    cli_.set_read_timeout(o.timeout_s);
    cli_.set_write_timeout(60);
    if (!o.api_key.empty()) cli_.set_bearer_token_auth(o.api_key);
  }

  std::string where() const { return e_.scheme_host_port + e_.base; }

  // GET /v1/models: the served ids, and the time the answer took.
  Expected<std::pair<std::vector<std::string>, double>> models() {
    auto t0 = Clock::now();
    auto res = cli_.Get(e_.base + "/v1/models");
    const double s = since(t0);
    if (!res) return make_error("cannot reach " + where() + "/v1/models: " + httplib::to_string(res.error()));
    if (res->status != 200)
      return make_error(where() + "/v1/models answered HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300));
    std::vector<std::string> ids;
    try {
      const json list = json::parse(res->body);
      for (const auto& m : list.at("data")) ids.push_back(m.at("id").get<std::string>());
    } catch (const std::exception& ex) {
      return make_error(where() + "/v1/models: not an OpenAI model list (" + ex.what() + ")");
    }
    return std::make_pair(ids, s);
  }

  // One streamed chat completion of `words` random words and up to `gen` generated tokens.
  Expected<RunResult> run(const std::string& model, int words, int gen) {
    std::string prompt;
    for (int i = 0; i < words; ++i) {
      if (i) prompt += ' ';
      prompt += kWords[rng_() % (sizeof kWords / sizeof kWords[0])];
    }
    json body{{"model", model},
              {"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
              {"max_tokens", gen},
              {"min_tokens", gen},
              {"ignore_eos", true},
              {"temperature", 0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"return_token_ids", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = e_.base + "/v1/chat/completions";
    req.headers = {{"Accept", "text/event-stream"}};
    if (!o_.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + o_.api_key);
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    RunResult r;
    std::string buf, raw;
    std::string error;
    std::optional<int64_t> usage_prompt, usage_completion;
    int64_t ids = 0, content_chunks = 0;
    bool saw_ids = false, saw_choices = false, saw_token = false, done = false;
    int status = 0;
    const auto t0 = Clock::now();
    req.response_handler = [&](const httplib::Response& res) {
      status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      const double t = since(t0);
      if (status != 200) {
        raw.append(data, n);
        return raw.size() < 4096;
      }
      buf.append(data, n);
      for (;;) {
        size_t end = buf.find("\n\n");
        size_t sep = 2;
        const size_t crlf = buf.find("\r\n\r\n");
        if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
          end = crlf;
          sep = 4;
        }
        if (end == std::string::npos) break;
        std::string event = buf.substr(0, end);
        buf.erase(0, end + sep);
        size_t pos = 0;
        while (pos < event.size()) {
          size_t eol = event.find('\n', pos);
          if (eol == std::string::npos) eol = event.size();
          std::string line = event.substr(pos, eol - pos);
          pos = eol + 1;
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (line.rfind("data:", 0) != 0) continue;
          std::string payload = line.substr(5);
          if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
          if (payload == "[DONE]") {
            done = true;
            continue;
          }
          json chunk;
          try {
            chunk = json::parse(payload);
          } catch (const std::exception&) {
            error = "the stream carried a data line that is not JSON: " + payload.substr(0, 200);
            return false;
          }
          if (chunk.contains("error")) {
            error = "the stream carried an error: " + chunk["error"].dump().substr(0, 300);
            return false;
          }
          if (chunk.contains("usage") && chunk["usage"].is_object()) {
            const json& u = chunk["usage"];
            if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
              usage_prompt = u["prompt_tokens"].get<int64_t>();
            if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
              usage_completion = u["completion_tokens"].get<int64_t>();
          }
          if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) continue;
          if (!saw_choices) {
            saw_choices = true;
            r.ttfr_s = t;
          }
          const json& ch = chunk["choices"][0];
          int64_t n_ids = 0;
          if (ch.contains("token_ids") && ch["token_ids"].is_array()) {
            saw_ids = true;
            n_ids = static_cast<int64_t>(ch["token_ids"].size());
          }
          bool text = false;
          if (ch.contains("delta") && ch["delta"].is_object()) {
            const json& d = ch["delta"];
            for (const char* k : {"content", "reasoning_content", "reasoning"})
              if (d.contains(k) && d[k].is_string() && !d[k].get<std::string>().empty()) text = true;
            if (d.contains("tool_calls") && d["tool_calls"].is_array() && !d["tool_calls"].empty()) text = true;
          }
          if (text || n_ids > 0) {
            if (!saw_token) {
              saw_token = true;
              r.t_first_token = t;
            }
            ids += n_ids;
            ++content_chunks;
          }
        }
      }
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool ok = cli_.send(req, res, err);
    r.t_end = since(t0);
    if (!error.empty()) return make_error(where() + "/v1/chat/completions: " + error);
    if (status != 0 && status != 200)
      return make_error(where() + "/v1/chat/completions answered HTTP " + std::to_string(status) + ": " +
                        (raw.empty() ? res.body : raw).substr(0, 300));
    if (!ok) return make_error("request to " + where() + "/v1/chat/completions failed: " + httplib::to_string(err));
    if (!done && !saw_choices) return make_error(where() + "/v1/chat/completions: the answer was not an SSE stream");
    if (!usage_prompt)
      return make_error(where() + "/v1/chat/completions: the stream has no usage.prompt_tokens "
                        "(the server must honour stream_options.include_usage)");
    if (!saw_token) return make_error(where() + "/v1/chat/completions: the stream carried no tokens");
    r.prompt_tokens = *usage_prompt;
    r.e2e_ttft_s = r.t_first_token;
    if (saw_ids) {
      r.gen_tokens = ids;
      r.token_source = "token_ids";
    } else if (usage_completion) {
      r.gen_tokens = *usage_completion;
      r.token_source = "usage";
    } else {
      r.gen_tokens = content_chunks;
      r.token_source = "chunks";
    }
    return r;
  }

 private:
  Endpoint e_;
  const BenchUrlOptions& o_;
  httplib::Client cli_;
  std::mt19937 rng_;
};

struct Stat {
  double mean = 0, sd = 0;
  bool empty = true;
};
// null where no run gave a value (e.g. ttfr <= latency), as llama-benchy leaves the cell empty.
json value_or_null(const Stat& s, double v) { return s.empty ? json(nullptr) : json(v); }
Stat stat(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.empty = false;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / static_cast<double>(v.size() - 1));
  }
  return s;
}


// The value at quantile q (0..1) of v, nearest rank (v is copied and sorted).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) ;
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

// --concurrency: for each level C and prompt length, C clients stream requests at once, each one
// request after another (--runs requests per client); aggregate throughput over the phase's wall
// time, latency percentiles over all requests. A failed request is counted, not fatal.
json run_load(const Endpoint& ep, const BenchUrlOptions& o, const std::string& model, double per_word, double overhead) {
  json rows = json::array();
  if (!o.json)
    std::printf("%6s %6s %9s %12s %12s %10s %10s %10s %10s %7s\n", "conc", "pp", "requests", "out tok/s", "in tok/s",
                "ttft p50", "ttft p99", "tpot p50", "tpot p99", "errors");
  uint32_t seed = 1;
  for (int C : o.concurrency) {
    for (int pp : o.prompt_lens) {
      const int words = std::max(1, static_cast<int>(std::lround((pp - overhead) / per_word)));
      std::vector<std::vector<RunResult>> done(static_cast<size_t>(C));
      std::vector<int> errors(static_cast<size_t>(C), 0);
      std::vector<std::string> first_error(static_cast<size_t>(C));
      const auto t0 = Clock::now();
      std::vector<std::thread> threads;
      for (int c = 0; c < C; ++c) {
        // Distinct word streams per client and phase: no two prompts share a prefix beyond chance.
        const uint32_t client_seed = 0x9e3779b9u * (seed++) + 20261201u;
        threads.emplace_back([&, c, client_seed] {
          BenchClient client(ep, o, client_seed);
          for (int r = 0; r < o.runs; ++r) {
            auto res = client.run(model, words, o.gen_tokens);
            if (res) {
              done[static_cast<size_t>(c)].push_back(*res);
            } else {
              if (errors[static_cast<size_t>(c)]++ == 0) first_error[static_cast<size_t>(c)] = res.message();
            }
          }
        });
      }
      for (auto& t : threads) t.join();
      const double wall = since(t0);
      std::vector<double> ttft, tpot;
      double out_tokens = 0, in_tokens = 0;
      int n = 0, n_err = 0;
      std::string err_text;
      for (int c = 0; c < C; ++c) {
        n_err += errors[static_cast<size_t>(c)];
        if (err_text.empty()) err_text = first_error[static_cast<size_t>(c)];
        for (const RunResult& r : done[static_cast<size_t>(c)]) {
          ++n;
          out_tokens += static_cast<double>(r.gen_tokens);
          in_tokens += static_cast<double>(r.prompt_tokens);
          ttft.push_back(r.e2e_ttft_s * 1e3);
          if (r.gen_tokens > 1) tpot.push_back((r.t_end - r.t_first_token) / static_cast<double>(r.gen_tokens - 1) * 1e3);
        }
      }
      json row{{"concurrency", C},
               {"pp", pp},
               {"requests", n},
               {"errors", n_err},
               {"wall_s", wall},
               {"output_tokens_per_s", out_tokens / wall},
               {"input_tokens_per_s", in_tokens / wall},
               {"ttft_ms_median", quantile(ttft, 0.5)},
               {"ttft_ms_p99", quantile(ttft, 0.99)},
               {"ttft_ms_max", quantile(ttft, 1.0)},
               {"tpot_ms_median", quantile(tpot, 0.5)},
               {"tpot_ms_p99", quantile(tpot, 0.99)},
               {"generated_tokens_mean", n ? out_tokens / n : 0.0},
               {"prompt_tokens_mean", n ? in_tokens / n : 0.0}};
      if (n_err) row["first_error"] = err_text;
      rows.push_back(row);
      if (!o.json) {
        std::printf("%6d %6d %9d %12.1f %12.1f %10.1f %10.1f %10.2f %10.2f %7d\n", C, pp, n, out_tokens / wall,
                    in_tokens / wall, quantile(ttft, 0.5), quantile(ttft, 0.99), quantile(tpot, 0.5), quantile(tpot, 0.99),
                    n_err);
        if (n_err) std::printf("       first error: %s\n", err_text.c_str());
        std::fflush(stdout);
      }
    }
  }
  if (!o.json)
    std::printf("\n(out/in tok/s: all clients' generated / prompt tokens over the phase's wall time; ttft: request start ->\n"
                " first token chunk, ms; tpot: (end of stream - first token) / (generated - 1), ms, per request)\n");
  return rows;
}

}  // namespace

int run_bench_url(const BenchUrlOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  if (o.runs <= 0) return fail("--runs must be > 0");
  auto ep = parse_url(o.url);
  if (!ep) return fail(ep.message());
  BenchClient client(*ep, o);
  // Latency: llama-benchy's `api` mode, the mean time of three GET /models.
  std::vector<double> lat;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto m = client.models();
    if (!m) return fail(m.message());
    ids = m->first;
    lat.push_back(m->second);
  }
  const double latency = stat(lat).mean;
  std::string model = o.model;
  if (model.empty()) {
    if (ids.size() != 1) {
      std::string list;
      for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
      return fail(client.where() + " serves " + std::to_string(ids.size()) + " models (" + list +
                  "): name one with --served-model");
    }
    model = ids[0];
  }
  // Calibration: prompt tokens for 64 and 128 words give tokens per word and the template overhead.
  auto p1 = client.run(model, 64, 1);
  if (!p1) return fail(p1.message());
  auto p2 = client.run(model, 128, 1);
  if (!p2) return fail(p2.message());
  const double per_word = static_cast<double>(p2->prompt_tokens - p1->prompt_tokens) / 64.0;
  if (!(per_word > 0))
    return fail(client.where() + ": usage.prompt_tokens did not grow with the prompt (" + std::to_string(p1->prompt_tokens) +
                " for 64 words, " + std::to_string(p2->prompt_tokens) + " for 128)");
  const double overhead = static_cast<double>(p1->prompt_tokens) - 64.0 * per_word;
  // Warm-up request, as llama-benchy's --warmup-runs 1.
  if (auto w = client.run(model, 64, std::min(o.gen_tokens, 4)); !w) return fail(w.message());

  if (!o.concurrency.empty()) {
    for (int c : o.concurrency)
      if (c <= 0 || c > 4096) return fail("--concurrency values must be in 1..4096");
    if (!o.json)
      std::printf("%s model %s: %.3f tokens per word, chat template %.0f tokens, %d generated tokens, %d requests per client\n\n",
                  o.url.c_str(), model.c_str(), per_word, overhead, o.gen_tokens, o.runs);
    json rows = run_load(*ep, o, model, per_word, overhead);
    if (o.json) {
      json j{{"url", o.url}, {"model", model}, {"gen_tokens", o.gen_tokens}, {"requests_per_client", o.runs},
             {"tokens_per_word", per_word}, {"template_overhead_tokens", overhead}, {"results", rows}};
      std::printf("%s\n", j.dump().c_str());
    }
    if (!o.json_out.empty()) {
      json j{{"url", o.url}, {"model", model}, {"gen_tokens", o.gen_tokens}, {"requests_per_client", o.runs},
             {"tokens_per_word", per_word}, {"template_overhead_tokens", overhead}, {"results", rows}};
      if (std::FILE* f = std::fopen(o.json_out.c_str(), "w")) {
        std::fprintf(f, "%s\n", j.dump(1).c_str());
        std::fclose(f);
      } else {
        return fail("cannot write --json-out " + o.json_out);
      }
    }
    return 0;
  }

  json j;
  j["url"] = o.url;
  j["model"] = model;
  j["latency_ms"] = latency * 1e3;
  j["tokens_per_word"] = per_word;
  j["template_overhead_tokens"] = overhead;
  j["gen_tokens"] = o.gen_tokens;
  j["runs"] = o.runs;
  j["results"] = json::array();
  if (!o.json) {
    std::printf("%s model %s: latency %.2f ms (GET /v1/models), %.3f tokens per word, chat template %.0f tokens\n\n",
                o.url.c_str(), model.c_str(), latency * 1e3, per_word, overhead);
    std::printf("%-8s %8s %18s %18s %12s %12s %12s %14s\n", "pp", "tokens", "pp t/s", "tg t/s", "ttfr ms", "est_ppt ms",
                "e2e_ttft ms", "pp t/s (e2e)");
  }
  for (int pp : o.prompt_lens) {
    const int words = std::max(1, static_cast<int>(std::lround((pp - overhead) / per_word)));
    std::vector<double> pp_tps, pp_e2e_tps, tg_tps, ttfr, ppt, ttft, e2e, prompt_tokens, gen;
    std::string source;
    for (int r = 0; r < o.runs; ++r) {
      auto res = client.run(model, words, o.gen_tokens);
      if (!res) return fail(res.message());
      // The server's count when within 20% of the request, else the requested count (llama-benchy).
      const double tokens = std::abs(static_cast<double>(res->prompt_tokens) - pp) < 0.2 * pp
                                ? static_cast<double>(res->prompt_tokens)
                                : static_cast<double>(pp);
      const double est_ppt = std::max(0.0, res->ttfr_s - latency);
      const double ttft_s = std::max(0.0, res->e2e_ttft_s - latency);
      if (est_ppt > 0) pp_tps.push_back(tokens / est_ppt);
      if (ttft_s > 0) pp_e2e_tps.push_back(tokens / ttft_s);
      const double decode_s = res->t_end - res->t_first_token;
      if (res->gen_tokens > 1 && decode_s > 0) tg_tps.push_back(static_cast<double>(res->gen_tokens - 1) / decode_s);
      ttft.push_back(ttft_s * 1e3);
      ttfr.push_back(res->ttfr_s * 1e3);
      ppt.push_back(est_ppt * 1e3);
      e2e.push_back(res->e2e_ttft_s * 1e3);
      prompt_tokens.push_back(static_cast<double>(res->prompt_tokens));
      gen.push_back(static_cast<double>(res->gen_tokens));
      source = res->token_source;
    }
    const Stat a = stat(pp_tps), b = stat(tg_tps), c = stat(ttfr), d = stat(ppt), e = stat(e2e), f = stat(pp_e2e_tps);
    json row{{"pp", pp},
             {"prompt_tokens", stat(prompt_tokens).mean},
             {"generated_tokens", stat(gen).mean},
             {"token_count_source", source},
             {"pp_tokens_per_s", value_or_null(a, a.mean)},
             {"pp_tokens_per_s_sd", value_or_null(a, a.sd)},
             {"tg_tokens_per_s", value_or_null(b, b.mean)},
             {"tg_tokens_per_s_sd", value_or_null(b, b.sd)},
             {"ttfr_ms", c.mean},
             {"est_ppt_ms", d.mean},
             {"e2e_ttft_ms", e.mean},
             {"ttft_ms", stat(ttft).mean},
             {"pp_e2e_tokens_per_s", value_or_null(f, f.mean)}};
    j["results"].push_back(row);
    if (!o.json) {
      std::printf("%-8d %8.0f %10.1f ± %-6.1f %10.1f ± %-6.1f %12.2f %12.2f %12.2f %14.1f\n", pp, stat(prompt_tokens).mean,
                  a.mean, a.sd, b.mean, b.sd, c.mean, d.mean, e.mean, f.mean);
      std::fflush(stdout);
    }
  }
  if (!o.json_out.empty()) {
    std::FILE* f = std::fopen(o.json_out.c_str(), "w");
    if (!f) return fail("cannot write --json-out " + o.json_out);
    std::fprintf(f, "%s\n", j.dump(1).c_str());
    std::fclose(f);
  }
  if (o.json) std::printf("%s\n", j.dump().c_str());
  else
    std::printf("\n(llama-benchy's definitions: pp t/s = prompt tokens / (ttfr - latency), ttfr = first chunk with choices;\n"
                " tg t/s = (generated - 1) / (end of stream - first token chunk), generated tokens counted from %s.\n"
                " pp t/s (e2e) = prompt tokens / (first token chunk - latency): for servers that send the role chunk\n"
                " before the prefill, where ttfr measures no prefill)\n",
                j["results"].empty() ? "-" : j["results"].back()["token_count_source"].get<std::string>().c_str());
  return 0;
}

}  // namespace sparkserve::cli
