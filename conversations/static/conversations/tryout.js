// "Try this persona": send a message, show the reply with its audio. The history of this
// page goes back with each message (the server keeps nothing), bounded by the server.
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("xz-try-form");
  if (!form) return;
  const log = document.getElementById("xz-try-log");
  const box = document.getElementById("xz-try-message");
  const send = document.getElementById("xz-try-send");
  const status = document.getElementById("xz-try-status");
  const t = document.getElementById("xz-try-strings").dataset;
  const history = [];

  function add(kind, who, text) {
    const item = document.createElement("div");
    item.className = `xz-try-msg xz-try-${kind}`;
    const name = document.createElement("span");
    name.className = "xz-try-who";
    name.textContent = who;
    const body = document.createElement("span");
    body.className = "xz-try-text";
    body.textContent = text;
    item.append(name, body);
    log.append(item);
    return item;
  }

  function meta(item, text) {
    const line = document.createElement("span");
    line.className = "xz-try-meta";
    line.textContent = text;
    item.append(line);
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = box.value.trim();
    if (!message) return;
    add("user", t.you, message);
    box.value = "";
    send.disabled = true;
    status.textContent = t.thinking;
    try {
      const response = await fetch(form.dataset.url, {
        method: "POST",
        headers: {"Content-Type": "application/json",
                  "X-CSRFToken": form.querySelector("[name=csrfmiddlewaretoken]").value},
        body: JSON.stringify({message, history}),
        credentials: "same-origin",
      });
      const data = await response.json().catch(() => ({error: `${t.failed} (HTTP ${response.status})`}));
      if (!response.ok || data.error) {
        add("error", t.failed, data.error || `HTTP ${response.status}`);
        return;
      }
      const item = add("persona", `${t.persona}${data.emotion ? " · " + data.emotion : ""}`, data.reply);
      history.push([message, data.reply]);
      if (data.tools.length) {
        meta(item, `${t.tools}: ${data.tools.map((c) => c.name + (c.success ? "" : " ✗")).join(", ")}`);
      }
      meta(item, `${t.served}: ${data.llm}${data.tts ? ` · ${t.voice}: ${data.tts}` : ""}`);
      if (data.audio) {
        const audio = document.createElement("audio");
        audio.controls = true;
        audio.preload = "auto";
        audio.src = data.audio;
        item.append(audio);
        if (data.spoken_in_part) meta(item, t.inPart);
      } else {
        meta(item, data.audio_error || t.noAudio);
      }
    } catch (error) {
      add("error", t.failed, String(error));
    } finally {
      send.disabled = false;
      status.textContent = "";
      box.focus();
    }
  });
});
