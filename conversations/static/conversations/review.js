// Conversation review: a player whose file has gone (retention, storage trouble) says so
// instead of showing a dead control.
document.addEventListener("DOMContentLoaded", () => {
  for (const audio of document.querySelectorAll(".xz-audio audio")) {
    audio.addEventListener("error", () => {
      const note = audio.parentElement.querySelector(".xz-unavailable");
      if (note) {
        note.hidden = false;
        audio.hidden = true;
      }
    });
  }
});
