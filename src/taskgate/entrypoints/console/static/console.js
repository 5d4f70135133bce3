// taskgate console: small progressive enhancement. Every page works without it; with it, live pages follow
// changes as they happen and the diff review takes line comments.
"use strict";

(function live() {
  const mark = document.body.dataset.live;
  const region = document.getElementById("live");
  if (mark === undefined || !region || !window.EventSource) return;
  let busy = false, again = false;
  // Typing into a form of the live part holds its updates back (they would wipe what was typed): a notice offers
  // to reload instead.
  region.addEventListener("input", () => { region.dataset.dirty = "1"; });
  function holdBack() {
    let note = document.getElementById("stale");
    if (!note) {
      note = document.createElement("p");
      note.id = "stale"; note.className = "error"; note.setAttribute("role", "status");
      note.append("This page changed while you were typing. ");
      const reload = document.createElement("a");
      reload.href = location.href; reload.textContent = "Reload it";
      note.append(reload);
      region.before(note);
    }
  }
  async function refresh() {
    if (region.dataset.dirty) { holdBack(); return; }
    if (busy) { again = true; return; }
    busy = true;
    try {
      const reply = await fetch(location.href, { headers: { "X-Console-Live": "1" }, credentials: "same-origin" });
      if (reply.redirected || !reply.ok) return;   // signed out or refused: leave the page as it is
      const keep = document.activeElement && region.contains(document.activeElement) ? document.activeElement.id : null;
      region.innerHTML = await reply.text();
      region.dispatchEvent(new CustomEvent("console:updated", { bubbles: true }));
      if (keep && document.getElementById(keep)) document.getElementById(keep).focus();
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }
  // While agents run, their log tails change without an event: refresh every 2 s as long as one runs.
  setInterval(() => { if (region.querySelector("[data-running]")) refresh(); }, 2000);
  const events = new EventSource("/events?since=" + encodeURIComponent(mark));
  events.addEventListener("changed", (e) => { document.body.dataset.seen = e.data; refresh(); });
})();

(function comments() {
  const form = document.getElementById("decide");
  if (!form) return;
  const count = document.getElementById("comment-count");
  function recount() {
    const n = document.querySelectorAll("textarea[name=comment_text]").length;
    count.textContent = n ? n + " line comment(s) will be sent with Request changes." : "";
  }
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button.comment");
    if (!button) return;
    const row = button.closest("tr");
    const existing = row.nextElementSibling;
    if (existing && existing.classList.contains("comment-row")) { existing.querySelector("textarea").focus(); return; }
    const file = button.dataset.file, line = button.dataset.line;
    const id = "c-" + Math.random().toString(36).slice(2);
    const tr = document.createElement("tr");
    tr.className = "comment-row";
    const td = document.createElement("td");
    td.colSpan = row.children.length;
    const label = document.createElement("label");
    label.htmlFor = id;
    label.textContent = "Comment on " + file + ":" + line;
    const text = document.createElement("textarea");
    text.id = id; text.name = "comment_text"; text.rows = 2; text.maxLength = 2000;
    text.setAttribute("form", "decide");
    const hidden = (name, value) => {
      const input = document.createElement("input");
      input.type = "hidden"; input.name = name; input.value = value; input.setAttribute("form", "decide");
      return input;
    };
    const remove = document.createElement("button");
    remove.type = "button"; remove.textContent = "Remove comment";
    remove.addEventListener("click", () => { tr.remove(); recount(); button.focus(); });
    td.append(label, text, hidden("comment_file", file), hidden("comment_line", line), remove);
    tr.append(td);
    row.after(tr);
    text.focus();
    recount();
  });
})();
