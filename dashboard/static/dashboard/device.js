// The device admin page's presence line: polls the device's live state every 2 s.
(function () {
  "use strict";
  var panel = document.getElementById("dash-device-panel");
  if (!panel) { return; }
  var state = panel.querySelector("[data-device-online]");
  function poll() {
    if (document.hidden) { return; }
    fetch(panel.dataset.liveUrl, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (response) { return response.ok && !response.redirected ? response.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        state.textContent = data.online ? panel.dataset.onlineLabel : panel.dataset.offlineLabel;
        state.classList.toggle("online", data.online);
      })
      .catch(function () { /* the next poll tries again */ });
  }
  setInterval(poll, 2000);
})();
