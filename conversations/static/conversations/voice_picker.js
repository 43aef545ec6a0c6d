/* Voice pickers (admin): a voice box marked data-voice-picker gets a <datalist> of the voices
 * its engines really have (GET data-voices-url?kind=…&language=…), refreshed when the kind or
 * the language changes, and a preview button that speaks a sentence in the typed voice through
 * a configuration's Test endpoint (data-preview-url). The box stays free text. No dependencies. */
(function () {
  "use strict";
  var counter = 0;

  function value(id) {
    var el = id ? document.getElementById(id) : null;
    return el ? el.value : "";
  }

  function kinds(input) {
    if (input.dataset.kinds) { return input.dataset.kinds.split(",").filter(Boolean); }
    if (input.dataset.stageSource && value(input.dataset.stageSource) !== "tts") { return []; }
    var kind = value(input.dataset.kindSource);
    return kind ? [kind] : [];
  }

  function language(input, select) {
    if (select) { return select.value; }
    return value(input.dataset.languageSource);
  }

  function refresh(input, list, select) {
    var wanted = kinds(input);
    list.textContent = "";
    if (!wanted.length) { return Promise.resolve(); }
    var query = wanted.map(function (k) { return "kind=" + encodeURIComponent(k); });
    var lang = language(input, select);
    if (lang) { query.push("language=" + encodeURIComponent(lang)); }
    return fetch(input.dataset.voicesUrl + "?" + query.join("&"), {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.json() : {voices: []}; })
      .then(function (data) {
        (data.voices || []).forEach(function (voice) {
          var option = document.createElement("option");
          option.value = voice.name;
          option.label = [voice.label, voice.language, voice.gender, wanted.length > 1 ? voice.kind : ""]
            .filter(Boolean).join(" · ");
          list.appendChild(option);
        });
        input.dataset.voiceCount = String((data.voices || []).length);
      });
  }

  function languageSelect(input) {
    if (!input.dataset.languages) { return null; }
    var select = document.createElement("select");
    select.className = "voice-language";
    var all = document.createElement("option");
    all.value = "";
    all.textContent = input.dataset.allLanguages || "all";
    select.appendChild(all);
    JSON.parse(input.dataset.languages).forEach(function (pair) {
      var option = document.createElement("option");
      option.value = pair[0];
      option.textContent = pair[1];
      select.appendChild(option);
    });
    input.insertAdjacentElement("afterend", select);
    return select;
  }

  function previewButton(input, select) {
    if (!input.dataset.previewUrl) { return; }
    var button = document.createElement("button");
    button.type = "button";
    button.className = "button voice-preview";
    button.textContent = input.dataset.previewLabel || "Preview";
    var output = document.createElement("output");
    output.className = "voice-preview-output";
    var audio = document.createElement("audio");
    audio.controls = true;
    audio.hidden = true;
    audio.className = "voice-preview-audio";
    var anchor = select || input;
    anchor.insertAdjacentElement("afterend", button);
    button.insertAdjacentElement("afterend", output);
    output.insertAdjacentElement("afterend", audio);
    button.addEventListener("click", function () {
      var body = new URLSearchParams();
      body.append("voice", input.value);
      var lang = language(input, select);
      if (lang) { body.append("language", lang); }
      var token = document.querySelector("input[name=csrfmiddlewaretoken]");
      button.disabled = true;
      output.textContent = "…";
      fetch(input.dataset.previewUrl, {method: "POST", body: body, credentials: "same-origin",
                                       headers: {"X-CSRFToken": token ? token.value : ""}})
        .then(function (response) {
          var type = response.headers.get("Content-Type") || "";
          if (response.ok && type.indexOf("audio/") === 0) {
            return response.blob().then(function (blob) {
              audio.src = URL.createObjectURL(blob);
              audio.hidden = false;
              output.textContent = "";
              var played = audio.play();
              if (played && played.catch) { played.catch(function () {}); }
            });
          }
          return response.json().then(function (data) { output.textContent = data.summary || data.error || ""; });
        })
        .catch(function (error) { output.textContent = String(error); })
        .finally(function () { button.disabled = false; });
    });
  }

  function setUp(input) {
    var list = document.createElement("datalist");
    list.id = "voice-options-" + (++counter);
    input.setAttribute("list", list.id);
    input.insertAdjacentElement("afterend", list);
    var select = languageSelect(input);
    previewButton(input, select);
    var update = function () { refresh(input, list, select); };
    [input.dataset.kindSource, input.dataset.stageSource, input.dataset.languageSource].forEach(function (id) {
      var source = id ? document.getElementById(id) : null;
      if (source) { source.addEventListener("change", update); }
    });
    if (select) { select.addEventListener("change", update); }
    update();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("input[data-voice-picker]").forEach(setUp);
  });
})();
