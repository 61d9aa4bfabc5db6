// vipu's dashboard: keeps the page live. The server says which parts changed (server-sent
// events at /events); when one the page shows did, the page's main block is fetched again and
// each live region in it replaced, leaving forms alone. Clicking a cable shows its test lines
// and links to the pages of the links at its ends.
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
      const fresh = new DOMParser().parseFromString(`<main>${await response.text()}</main>`, "text/html").body.firstElementChild;
      swap(fresh);
      main.dataset.redraws = String(Number(main.dataset.redraws || 0) + 1);
      if (chosen) show(main.querySelector(`g.cable[data-cable="${CSS.escape(chosen)}"]`));
    } catch (error) {
      say("offline");
    } finally {
      drawing = false;
      if (again) { again = false; redraw(); }
    }
  }

  // Each live region of the fresh main block replaces its namesake, unless their digests say
  // they are the same (a rack's columns); regions inside one replaced come with it. When the
  // regions are not the same ones (a cluster more, a notice gone), the whole block is replaced.
  function swap(fresh) {
    const now = new Map([...main.querySelectorAll("[data-live]")].map((region) => [region.id, region]));
    const next = [...fresh.querySelectorAll("[data-live]")];
    if (!next.length || next.length !== now.size || !next.every((region) => now.has(region.id))) {
      main.replaceChildren(...[...fresh.childNodes].map((node) => document.importNode(node, true)));
      return;
    }
    for (const region of next) {
      const old = now.get(region.id);
      if (!old.isConnected || (region.dataset.digest && region.dataset.digest === old.dataset.digest)) continue;
      old.replaceWith(document.importNode(region, true));
    }
  }

  function show(cable) {
    main.querySelectorAll("g.cable.chosen").forEach((g) => g.classList.remove("chosen"));
    if (!cable) return;
    cable.classList.add("chosen");
    const detail = cable.closest("section").querySelector(".cable-detail");
    if (detail) {
      detail.textContent = cable.querySelector("title").textContent;
      for (const end of cable.querySelectorAll("a.cable-end")) {
        const link = document.createElement("a");
        link.href = end.getAttribute("href");
        link.textContent = `link ${end.dataset.link}`;
        detail.append("\n", link);
      }
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
