// The chat page served at GET /: one self-contained HTML document (no build step, no CDN) that
// talks to this server's own /v1/models and /v1/chat/completions (streamed), shows the
// reasoning in a collapsed block and tool calls as they arrive, and has a stop button.
#include "server/chat_page.h"

namespace sparkserve {

std::string_view chat_page_html() {
  static constexpr std::string_view kPage = R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sparkserve</title>
<style>
  :root { --fg: #1d1d1f; --muted: #6e6e73; --bg: #fafafa; --card: #fff; --line: #e3e3e8; --accent: #2f6fde; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; color: var(--fg); background: var(--bg);
         display: flex; flex-direction: column; height: 100vh; }
  header { display: flex; gap: 12px; align-items: center; padding: 8px 16px; border-bottom: 1px solid var(--line);
           background: var(--card); flex-wrap: wrap; }
  header b { margin-right: 8px; }
  header label { color: var(--muted); font-size: 13px; }
  select, input, textarea, button { font: inherit; }
  input[type=number] { width: 6em; }
  #log { flex: 1; overflow-y: auto; padding: 16px; display: flex; flex-direction: column; gap: 12px; }
  .msg { max-width: 900px; padding: 10px 14px; border-radius: 10px; background: var(--card); border: 1px solid var(--line);
         white-space: pre-wrap; word-wrap: break-word; }
  .user { align-self: flex-end; background: #e8f0fe; border-color: #c9dafc; }
  .assistant { align-self: flex-start; }
  details.reasoning { color: var(--muted); font-size: 13px; margin-bottom: 6px; }
  details.reasoning summary { cursor: pointer; }
  .tool { font-family: ui-monospace, monospace; font-size: 13px; background: #f4f4f6; border-radius: 6px;
          padding: 6px 8px; margin-top: 6px; }
  .meta { color: var(--muted); font-size: 12px; margin-top: 4px; }
  .error { color: #b3261e; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid var(--line); background: var(--card); }
  textarea { flex: 1; resize: vertical; padding: 8px; border: 1px solid var(--line); border-radius: 8px; }
  button { padding: 0 16px; border-radius: 8px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; }
  button#stop { background: #fff; color: var(--accent); }
  button:disabled { opacity: .4; cursor: default; }
</style>
</head>
<body>
<header>
  <b>sparkserve</b>
  <label>model <select id="model"></select></label>
  <label><input type="checkbox" id="think" checked> thinking</label>
  <label>max tokens <input type="number" id="max-tokens" value="1024" min="1"></label>
  <label>API key <input type="password" id="key" placeholder="if the server has one" size="14"></label>
  <button id="clear" type="button">New chat</button>
</header>
<main id="log"></main>
<form id="form">
  <textarea id="input" rows="3" placeholder="Message (Enter sends, Shift+Enter for a new line)"></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;
window.sparkserveEvents = 0;  // SSE events received (the browser test reads it)

$("key").value = localStorage.getItem("sparkserve-key") || "";
$("key").addEventListener("change", () => { localStorage.setItem("sparkserve-key", $("key").value); loadModels(); });

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    const sel = $("model");
    sel.innerHTML = "";
    for (const m of j.data || []) {
      const o = document.createElement("option");
      o.value = o.textContent = m.id;
      sel.appendChild(o);
    }
  } catch (e) { addError("cannot list models: " + e); }
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function addError(text) { $("log").appendChild(el("div", "msg error", text)); }

function scroll() { const l = $("log"); l.scrollTop = l.scrollHeight; }

async function send(text) {
  history.push({ role: "user", content: text });
  $("log").appendChild(el("div", "msg user", text));
  const box = el("div", "msg assistant");
  const details = el("details", "reasoning");
  details.appendChild(el("summary", "", "Reasoning"));
  const reasoning = el("div", "reasoning-text");
  details.appendChild(reasoning);
  details.hidden = true;
  const content = el("div", "content");
  const tools = el("div", "tools");
  const meta = el("div", "meta");
  box.append(details, content, tools, meta);
  $("log").appendChild(box);
  scroll();

  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const calls = {};
  let finish = null, usage = null;
  const t0 = performance.now();
  try {
    const body = {
      model: $("model").value, messages: history, stream: true,
      stream_options: { include_usage: true },
      max_tokens: parseInt($("max-tokens").value, 10) || 1024,
      chat_template_kwargs: { enable_thinking: $("think").checked },
    };
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                    signal: controller.signal });
    if (!r.ok) throw new Error((await r.json()).error?.message || r.statusText);
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of ev.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          window.sparkserveEvents++;
          if (j.error) throw new Error(j.error.message);
          if (j.usage) usage = j.usage;
          for (const c of j.choices || []) {
            const d = c.delta || {};
            const r = d.reasoning_content || d.reasoning;
            if (r) { details.hidden = false; reasoning.textContent += r; }
            if (d.content) content.textContent += d.content;
            for (const tc of d.tool_calls || []) {
              const call = calls[tc.index] || (calls[tc.index] = { id: tc.id, name: "", args: "", node: el("div", "tool") });
              if (!call.node.parentNode) tools.appendChild(call.node);
              if (tc.function?.name) call.name = tc.function.name;
              if (tc.function?.arguments) call.args += tc.function.arguments;
              call.node.textContent = "\u2192 " + call.name + "(" + call.args + ")";
            }
            if (c.finish_reason) finish = c.finish_reason;
          }
        }
        scroll();
      }
    }
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped";
    else box.appendChild(el("div", "error", String(e.message || e)));
  } finally {
    const secs = (performance.now() - t0) / 1000;
    meta.textContent = (finish || "?") + (usage ? " \u00b7 " + usage.completion_tokens + " tokens \u00b7 " +
                       (usage.completion_tokens / secs).toFixed(1) + " tok/s" : "");
    const msg = { role: "assistant", content: content.textContent };
    if (reasoning.textContent) msg.reasoning_content = reasoning.textContent;
    const tc = Object.values(calls).map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.args } }));
    if (tc.length) msg.tool_calls = tc;
    history.push(msg);
    box.dataset.done = finish || "error";
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => { history.length = 0; $("log").innerHTML = ""; });
loadModels();
</script>
</body>
</html>
)PAGE";
  return kPage;
}

}  // namespace sparkserve
