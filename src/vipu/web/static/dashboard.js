// vipu's dashboard: keeps the page live. The server says which parts changed (server-sent
// events at /events); when one the page shows did, the page's main block is fetched again and
// each live region in it replaced, leaving forms alone. Clicking a cable shows its test lines.
"use strict";
(() => {
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  if (!main || !live) return; // the login page
  const wanted = new Set((main.dataset.parts || "").split(" ").filter(Boolean));
  const words = { live: "Live", polling: "Reconnecting", offline: "Offline", connecting: "Connecting" };
  let drawing = false, again = false, chosen = null, lost = false;

  function say(state) {
    live.dataset.state = state;
    live.textContent = words[state] || state;
  }

  async function redraw() {
    if (drawing) { again = true; return; }
    drawing = true;
    try {
      const response = await fetch(location.pathname + location.search,
        { headers: { "X-Vipu-Fragment": "1" }, cache: "no-store", credentials: "same-origin" });
      if (response.redirected || response.status === 401) { location.reload(); return; }
      main.dataset.version = response.headers.get("X-Vipu-Version") || main.dataset.version;
      const fresh = new DOMParser().parseFromString(`<main>${await response.text()}</main>`, "text/html").body.firstElementChild;
      const now = main.querySelectorAll("[data-live]"), next = fresh.querySelectorAll("[data-live]");
      if (now.length && [...now].every((region, i) => next[i] && next[i].id === region.id) && now.length === next.length) {
        now.forEach((region, i) => region.replaceWith(document.importNode(next[i], true)));
      } else {
        main.replaceChildren(...[...fresh.childNodes].map((node) => document.importNode(node, true)));
      }
      main.dataset.redraws = String(Number(main.dataset.redraws || 0) + 1);
      if (chosen) show(main.querySelector(`g.cable[data-cable="${CSS.escape(chosen)}"]`));
    } catch (error) {
      say("offline");
    } finally {
      drawing = false;
      if (again) { again = false; redraw(); }
    }
  }

  function show(cable) {
    main.querySelectorAll("g.cable.chosen").forEach((g) => g.classList.remove("chosen"));
    if (!cable) return;
    cable.classList.add("chosen");
    const detail = cable.closest("section").querySelector(".cable-detail");
    if (detail) {
      detail.textContent = cable.querySelector("title").textContent;
      detail.classList.toggle("muted", false);
    }
  }

  main.addEventListener("click", (event) => {
    const cable = event.target.closest && event.target.closest("g.cable");
    if (!cable) return;
    chosen = cable.dataset.cable;
    show(cable);
  });

  const events = new EventSource(`/events?since=${main.dataset.version}`);
  events.addEventListener("state", (event) => {
    say(event.data);
    if (lost) { lost = false; redraw(); } // back after a break: what changed meanwhile was not told
  });
  events.addEventListener("change", (event) => {
    const parts = JSON.parse(event.data);
    if (!wanted.size || parts.some((part) => wanted.has(part))) redraw();
  });
  events.addEventListener("ended", () => location.reload());
  events.onerror = () => { lost = true; say("offline"); };
})();
