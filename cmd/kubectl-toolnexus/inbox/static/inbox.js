// Live pages: every element with data-events is replaced by what its Server-Sent Events stream
// sends; a request's answer forms hide once it offers no answer any more (it was answered, or the
// approvals decide it).
"use strict";

function syncActions() {
  const state = document.querySelector("#live [data-offer]");
  const actions = document.getElementById("actions");
  if (state && actions) {
    actions.hidden = state.dataset.offer !== "true";
  }
}

document.querySelectorAll("[data-events]").forEach((el) => {
  const events = new EventSource(el.dataset.events);
  events.addEventListener("update", (e) => {
    el.innerHTML = e.data;
    syncActions();
  });
});

// A form is sent once: its buttons are disabled while the answer is on its way.
document.querySelectorAll("form[method=post]").forEach((form) => {
  form.addEventListener("submit", (e) => {
    const chosen = e.submitter;
    if (chosen && chosen.name) {
      const hidden = document.createElement("input");
      hidden.type = "hidden";
      hidden.name = chosen.name;
      hidden.value = chosen.value;
      form.appendChild(hidden);
    }
    form.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  });
});
