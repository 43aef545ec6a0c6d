/* "Test" buttons of provider configurations and personas (admin). A test is a POST to a
 * staff-only view; TTS answers with WAV audio, played in the panel's <audio>; everything else
 * answers JSON with a translated one-line `summary`. No dependencies. */
(function () {
  "use strict";

  function labels() {
    var el = document.getElementById("provider-test-labels");
    return el ? el.dataset : {running: "Testing…", audio: "Synthesized in {ms} ms.", failed: "Failed:", play: "Play"};
  }

  function csrfToken() {
    var input = document.querySelector("input[name=csrfmiddlewaretoken]");
    if (input) { return input.value; }
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function post(url, fields) {
    var body = new URLSearchParams();  // urlencoded: an empty multipart body is a 400
    Object.keys(fields || {}).forEach(function (key) { if (fields[key]) { body.append(key, fields[key]); } });
    return fetch(url, {method: "POST", body: body, credentials: "same-origin",
                       headers: {"X-CSRFToken": csrfToken()}});
  }

  /* Play a WAV response in `audio`; returns the summary line. */
  function playAudio(response, audio) {
    var ms = response.headers.get("X-Probe-Ms") || "?";
    return response.blob().then(function (blob) {
      if (audio.src && audio.src.indexOf("blob:") === 0) { URL.revokeObjectURL(audio.src); }
      audio.src = URL.createObjectURL(blob);
      audio.hidden = false;
      var played = audio.play();
      if (played && played.catch) { played.catch(function () { /* autoplay refused: the controls remain */ }); }
      return labels().audio.replace("{ms}", ms);
    });
  }

  /* The JSON body, or {error: "HTTP 403"} for a reply that is not JSON (a proxy's page). */
  function readJson(response) {
    return response.text().then(function (text) {
      try { return JSON.parse(text); } catch (e) {
        return {error: labels().failed + " HTTP " + response.status + " " + response.statusText};
      }
    });
  }

  function answer(response, audio) {
    var type = response.headers.get("Content-Type") || "";
    if (response.ok && type.indexOf("audio/") === 0) { return playAudio(response, audio); }
    return readJson(response).then(function (data) { return data.summary || data.error; });
  }

  function runConfig(button) {
    var panel = button.closest("[data-probe-panel]");
    var output = panel.querySelector("[data-probe-output]");
    var audio = panel.querySelector("audio[data-probe-audio]");
    button.disabled = true;
    output.textContent = labels().running;
    var fields = {text: button.dataset.text, voice: button.dataset.voice || panel.dataset.voice,
                  language: button.dataset.language || panel.dataset.language};
    post(button.dataset.probeUrl, fields)
      .then(function (response) { return answer(response, audio); })
      .then(function (line) { output.textContent = line; })
      .catch(function (error) { output.textContent = labels().failed + " " + error; })
      .finally(function () { button.disabled = false; });
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function runPersona(button) {
    var panel = button.closest("[data-probe-panel]");
    var output = panel.querySelector("[data-probe-output]");
    var table = panel.querySelector("[data-probe-table]");
    var body = table.querySelector("tbody");
    button.disabled = true;
    output.textContent = labels().running;
    post(button.dataset.personaProbeUrl, {})
      .then(readJson)
      .then(function (data) {
        output.textContent = data.error || "";
        body.textContent = "";
        (data.results || []).forEach(function (result) {
          var row = document.createElement("tr");
          row.className = result.ok ? "probe-ok" : "probe-failed";
          cell(row, result.stage.toUpperCase());
          cell(row, result.name);
          cell(row, (result.ok ? "✔ " : "✘ ") + result.summary);
          var last = cell(row, "");
          if (result.ok && result.stage === "tts") {
            var play = document.createElement("button");
            play.type = "button";
            play.className = "button";
            play.textContent = labels().play;
            play.dataset.probeUrl = button.dataset.configProbeUrl.replace("/0/test/", "/" + result.config_id + "/test/");
            play.addEventListener("click", function () { runConfig(play); });
            last.appendChild(play);
          }
          body.appendChild(row);
        });
        table.hidden = false;
      })
      .catch(function (error) { output.textContent = labels().failed + " " + error; })
      .finally(function () { button.disabled = false; });
  }

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) { return; }
    var config = target.closest("button[data-probe-url]");
    if (config && !config.closest("#persona-test tbody")) { event.preventDefault(); runConfig(config); return; }
    var persona = target.closest("button[data-persona-probe-url]");
    if (persona) { event.preventDefault(); runPersona(persona); }
  });

  window.xiaozhiProviderTest = {run: runConfig};
})();
