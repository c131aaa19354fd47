// The gateway's page: translation streamed as server-sent events, sentiment and summary beside it, and the
// cross-attention of one sentence as a heatmap; the translator and the summarizer are picked among the served
// tasks (/v1/tasks). Plain JavaScript, nothing loaded from elsewhere.
"use strict";

(() => {
  const KEY_STORAGE = "ropeserve.apiKey";
  const MAX_CHARACTERS = 10000;

  const $ = (id) => document.getElementById(id);
  const form = $("form");
  const source = $("source");
  const count = $("count");
  const beams = $("beams");
  const translator = $("translator");
  const summarizer = $("summarizer");
  const apiKey = $("api-key");
  const errorBox = $("error");
  const translation = $("translation");
  const progress = $("progress");
  const sentiment = $("sentiment");
  const summary = $("summary");
  const alignment = $("alignment");
  const alignmentBody = $("alignment-body");

  // ---- small helpers ---------------------------------------------------------------------------------------

  function element(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (name === "text") node.textContent = value;
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function storedKey() {
    try {
      return localStorage.getItem(KEY_STORAGE) || "";
    } catch {
      return ""; // storage disabled (private mode, file policy): the field still works for this page
    }
  }

  function storeKey(value) {
    try {
      if (value) localStorage.setItem(KEY_STORAGE, value);
      else localStorage.removeItem(KEY_STORAGE);
    } catch {
      /* not stored; sent all the same */
    }
  }

  function headers() {
    const result = { "Content-Type": "application/json", Accept: "application/json, text/event-stream" };
    const key = apiKey.value.trim();
    if (key) result.Authorization = `Bearer ${key}`;
    return result;
  }

  /** The message of a refused request: the gateway's {"detail": ...}, or whatever the body and status say. */
  async function failure(response) {
    let message = "";
    try {
      const text = await response.text();
      try {
        const body = JSON.parse(text);
        message = body.detail ?? body.message ?? body.error ?? text;
        if (typeof message !== "string") message = JSON.stringify(message);
      } catch {
        message = text;
      }
    } catch {
      /* no body */
    }
    return `${message || response.statusText || "request failed"} (HTTP ${response.status})`;
  }

  const isAbort = (error) => error && error.name === "AbortError";

  /** POST `body` as JSON; a network failure (not an HTTP error status) says so. */
  async function send(path, body, signal) {
    try {
      return await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body), signal });
    } catch (error) {
      if (isAbort(error)) throw error;
      throw new Error(`could not reach the gateway (${error.message})`);
    }
  }

  async function postJSON(path, body, signal) {
    const response = await send(path, body, signal);
    if (!response.ok) throw new Error(await failure(response));
    return response.json();
  }

  function describe(error) {
    return error && error.message ? error.message : String(error);
  }

  // ---- errors ----------------------------------------------------------------------------------------------

  const errors = new Map(); // what failed → its message; one line each

  function showError(what, message) {
    errors.set(what, message);
    renderErrors();
  }

  function clearErrors() {
    errors.clear();
    renderErrors();
  }

  function renderErrors() {
    errorBox.replaceChildren(
      ...[...errors].map(([what, message]) => element("p", {}, element("strong", { text: `${what}: ` }), message)),
    );
    errorBox.hidden = errors.size === 0;
  }

  function busy(node, state) {
    node.setAttribute("aria-busy", state ? "true" : "false");
  }

  function placeholder(node, text) {
    node.replaceChildren(element("p", { className: "empty", text }));
  }

  // ---- server-sent events over fetch (EventSource cannot POST) ---------------------------------------------

  /** Yields {event, data} for each event of a text/event-stream response body. */
  async function* serverSentEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const boundary = /\r\n\r\n|\n\n|\r\r/;
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
        let match;
        while ((match = boundary.exec(buffer)) !== null) {
          const block = buffer.slice(0, match.index);
          buffer = buffer.slice(match.index + match[0].length);
          const event = parseEvent(block);
          if (event) yield event;
        }
        if (done) break;
      }
      const last = parseEvent(buffer);
      if (last) yield last;
    } finally {
      reader.releaseLock();
    }
  }

  function parseEvent(block) {
    let name = "message";
    const data = [];
    for (const line of block.split(/\r\n|\n|\r/)) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    }
    if (data.length === 0) return null;
    const text = data.join("\n");
    try {
      return { event: name, data: JSON.parse(text) };
    } catch {
      throw new Error(`the server sent an event that is not JSON: ${text.slice(0, 80)}`);
    }
  }

  // ---- the three tasks -------------------------------------------------------------------------------------

  let run = null; // the AbortController of the texts being worked on; a new submit aborts the last
  let sources = []; // source sentence i of the current translation
  let explaining = null; // the AbortController of the alignment being fetched
  const explainable = new Set(["translate"]); // translators with an explain twin (filled from /v1/tasks)

  async function translate(text, numBeams, signal) {
    translation.dataset.state = "streaming";
    busy(translation, true);
    placeholder(translation, "Translating…");
    progress.textContent = "";
    const spans = [];
    let started = false;
    let finished = 0;
    const model = translator.value;
    const clickable = explainable.has(model);
    const sentenceSpan = (i) => {
      if (!spans[i]) {
        if (!started) {
          translation.replaceChildren();
          started = true;
        }
        const attributes = { className: "sentence pending", "data-index": String(i), title: sources[i] ?? "" };
        if (clickable) {
          const label = `sentence ${i + 1}: show its alignment`;
          Object.assign(attributes, { role: "button", tabindex: "0", "aria-label": label });
        }
        const span = element("span", attributes);
        span.lang = "en";
        spans[i] = span;
        translation.append(span);
      }
      return spans[i];
    };
    const finishUpTo = (i) => {
      for (let j = 0; j < i && j < spans.length; j++) spans[j]?.classList.remove("pending");
      finished = Math.max(finished, i);
      if (sources.length > 1) {
        progress.textContent = `${Math.min(finished, sources.length)} / ${sources.length} sentences`;
      }
    };
    try {
      const response = await send(`/v1/${encodeURIComponent(model)}/stream`, { text, num_beams: numBeams }, signal);
      if (!response.ok) throw new Error(await failure(response));
      let ended = false;
      for await (const { event, data } of serverSentEvents(response)) {
        if (event === "error") throw new Error(`${data.error || "the stream failed"} (status ${data.status ?? "?"})`);
        if (event === "done") {
          ended = true;
          break;
        }
        if (Array.isArray(data.sentences)) {
          sources = data.sentences;
          if (sources.length > 1) progress.textContent = `0 / ${sources.length} sentences`;
        } else if (typeof data.sentence === "number") {
          finishUpTo(data.sentence);
          const span = sentenceSpan(data.sentence);
          span.textContent += data.text ?? "";
        } else if (typeof data.separator === "string") {
          finishUpTo(spans.length);
          if (!started) {
            translation.replaceChildren();
            started = true;
          }
          translation.append(document.createTextNode(data.separator)); // "\n" shows as a line break (pre-wrap)
        }
      }
      if (!ended) throw new Error("the stream ended before the translation was complete");
      if (!started) placeholder(translation, "(nothing to translate)");
      finishUpTo(spans.length);
      progress.textContent = sources.length > 1 ? `${sources.length} sentences` : "";
      translation.dataset.state = "done";
    } catch (error) {
      if (isAbort(error)) return;
      translation.dataset.state = "error";
      progress.textContent = "";
      if (!started) placeholder(translation, "No translation.");
      showError("Translation", describe(error));
    } finally {
      if (!signal.aborted) busy(translation, false);
    }
  }

  async function classify(text, signal) {
    busy(sentiment, true);
    placeholder(sentiment, "Reading…");
    try {
      const { results } = await postJSON("/v1/sentiment", { texts: [text] }, signal);
      const { label, score } = results[0];
      const percent = Math.round(Number(score) * 1000) / 10;
      const bar = element("div", {
        className: "bar",
        role: "meter",
        "aria-valuemin": "0",
        "aria-valuemax": "100",
        "aria-valuenow": String(percent),
        "aria-label": `confidence ${percent}%`,
      });
      const fill = element("div", { className: `fill ${label}` });
      fill.style.width = `${percent}%`;
      bar.append(fill);
      sentiment.replaceChildren(
        element(
          "p",
          { className: "verdict" },
          element("span", { className: `label ${label}`, "data-label": label, text: label }),
          element("span", { className: "score", text: `${percent}%` }),
        ),
        bar,
      );
    } catch (error) {
      if (isAbort(error)) return;
      placeholder(sentiment, "—");
      showError("Sentiment", describe(error));
    } finally {
      if (!signal.aborted) busy(sentiment, false);
    }
  }

  async function summarize(text, signal) {
    busy(summary, true);
    placeholder(summary, "Summarizing…");
    try {
      const { results } = await postJSON(`/v1/${encodeURIComponent(summarizer.value)}`, { texts: [text] }, signal);
      summary.replaceChildren(element("p", { className: "summary-text", text: results[0] || "(empty)" }));
    } catch (error) {
      if (isAbort(error)) return;
      placeholder(summary, "—");
      showError("Summary", describe(error));
    } finally {
      if (!signal.aborted) busy(summary, false);
    }
  }

  function submit() {
    const text = source.value;
    updateCount();
    run?.abort();
    explaining?.abort();
    run = null;
    clearErrors();
    for (const node of [translation, sentiment, summary]) busy(node, false);
    if (translation.dataset.state === "streaming") translation.dataset.state = "idle";
    if (!text.trim()) {
      showError("Nothing to translate", "paste or type some Chinese text first.");
      source.focus();
      return;
    }
    if (text.length > MAX_CHARACTERS) {
      showError("Too long", `the text has ${text.length} characters; at most ${MAX_CHARACTERS}.`);
      return;
    }
    run = new AbortController();
    const { signal } = run;
    sources = [];
    alignment.hidden = true;
    alignmentBody.replaceChildren();
    translate(text, Number(beams.value), signal);
    classify(text, signal);
    summarize(text, signal);
  }

  // ---- alignment: the last layer's cross-attention of one sentence ----------------------------------------

  async function explain(index, span) {
    const text = sources[index];
    if (!text || !explainable.has(translator.value)) return;
    explaining?.abort();
    explaining = new AbortController();
    const { signal } = explaining;
    for (const other of translation.querySelectorAll(".sentence.selected")) {
      other.classList.remove("selected");
      other.setAttribute("aria-pressed", "false");
    }
    span.classList.add("selected");
    span.setAttribute("aria-pressed", "true");
    errors.delete("Alignment");
    renderErrors();
    alignment.hidden = false;
    busy(alignment, true);
    alignmentBody.replaceChildren(element("p", { className: "empty", text: `Reading the attention for ${text}…` }));
    try {
      const answer = await postJSON(`/v1/explain/${encodeURIComponent(translator.value)}`, { text }, signal);
      alignmentBody.replaceChildren(...heatmap(text, answer));
    } catch (error) {
      if (isAbort(error)) return;
      alignment.hidden = true;
      showError("Alignment", describe(error));
    } finally {
      if (!signal.aborted) busy(alignment, false);
    }
  }

  function heatmap(text, answer) {
    const { translation: english, source_tokens: sourceTokens, target_tokens: targetTokens } = answer;
    const layers = answer.attention || [];
    const weights = layers[layers.length - 1] || []; // [target][source]
    const largest = Math.max(1e-9, ...weights.flat());
    const title = element(
      "h3",
      { className: "alignment-title" },
      element("span", { lang: "zh", text }),
      " → ",
      element("span", { lang: "en", text: english }),
    );
    const strongest = weights.map((row) => row.reduce((best, w, j) => (w > row[best] ? j : best), 0));

    const legend = element("p", {
      className: "legend",
      id: "alignment-legend",
      text:
        `Cross-attention of the decoder's last layer (${layers.length} of ${layers.length}), averaged over heads: ` +
        "a row per English token, a column per Chinese token; darker is more weight, outlined is the row's strongest.",
    });
    const table = element("table", {
      className: "heatmap",
      "aria-label": `attention of ${english} over ${text}`,
      "aria-describedby": "alignment-legend",
    });
    const head = element("tr", {}, element("th", { scope: "col", className: "corner", text: "target ＼ source" }));
    for (const token of sourceTokens) head.append(element("th", { scope: "col", lang: "zh", text: token }));
    table.append(element("thead", {}, head));
    const body = element("tbody");
    weights.forEach((row, t) => {
      const tr = element("tr", {}, element("th", { scope: "row", lang: "en", text: targetTokens[t] ?? "" }));
      row.forEach((weight, s) => {
        const shade = weight / largest;
        const value = weight.toFixed(3);
        const td = element("td", {
          title: `${targetTokens[t]} ← ${sourceTokens[s]}: ${value}`,
          "aria-label": `${targetTokens[t]} to ${sourceTokens[s]}: ${value}`,
          "data-weight": value,
        });
        td.style.setProperty("--w", shade.toFixed(3));
        if (strongest[t] === s) td.classList.add("strongest");
        tr.append(td);
      });
      body.append(tr);
    });
    table.append(body);

    const pairs = element("ol", { className: "pairs", "aria-labelledby": "pairs-title" });
    strongest.forEach((s, t) => {
      pairs.append(
        element(
          "li",
          {},
          element("span", { lang: "en", text: targetTokens[t] ?? "" }),
          " → ",
          element("span", { lang: "zh", text: sourceTokens[s] ?? "" }),
        ),
      );
    });
    const attendedMost = element(
      "div",
      { className: "attended" },
      element("p", { className: "caption-lead", id: "pairs-title", text: "Attended to most" }),
      pairs,
    );
    const scroll = element("div", { className: "scroll" }, table);
    const grid = element("div", { className: "alignment-grid" }, scroll, attendedMost);
    return [title, legend, grid];
  }

  // ---- the models to pick: every served task that answers TRANSLATION (and streams) or SUMMARY -------------

  async function listModels() {
    let tasks;
    try {
      const response = await fetch("/v1/tasks", { headers: headers() });
      if (!response.ok) return; // the built-in models stay the choice
      tasks = await response.json();
    } catch {
      return;
    }
    const fill = (select, wanted, usable) => {
      const served = tasks.filter((task) => task.ready && task.output === wanted && usable(task));
      const names = served.map((task) => task.name);
      if (names.length === 0) return;
      const chosen = names.includes(select.value) ? select.value : names[0];
      select.replaceChildren(...names.map((name) => element("option", { value: name, text: name })));
      select.value = chosen;
    };
    fill(translator, "TRANSLATION", (task) => task.stream);
    fill(summarizer, "SUMMARY", () => true);
    explainable.clear();
    for (const task of tasks) if (task.explain) explainable.add(task.name);
  }

  // ---- wiring ----------------------------------------------------------------------------------------------

  function updateCount() {
    count.textContent = `${source.value.length} / ${MAX_CHARACTERS}`;
  }

  apiKey.value = storedKey();
  apiKey.addEventListener("input", () => storeKey(apiKey.value.trim()));
  source.addEventListener("input", updateCount);
  source.addEventListener("change", updateCount);
  source.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      submit();
    }
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  translation.addEventListener("click", (event) => {
    const span = event.target.closest(".sentence");
    if (span) explain(Number(span.dataset.index), span);
  });
  translation.addEventListener("keydown", (event) => {
    const span = event.target.closest(".sentence");
    if (span && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      explain(Number(span.dataset.index), span);
    }
  });
  window.addEventListener("unhandledrejection", (event) => {
    event.preventDefault();
    showError("Unexpected", describe(event.reason));
  });
  updateCount();
  listModels();
})();
