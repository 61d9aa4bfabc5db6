"""vipu-web: the dashboard operators open first, a client of vipu-server's public API.

It runs as a process of its own (`vipu-web`), not inside the controller: it reads everything
through `vipu.client` with each viewer's own credentials, so it sees exactly what the API lets
that viewer see, follows the leader of a highly available controller as the CLIs do, and its
page rendering never takes the controller's CPU or threads. `sources` reads and keeps, `racks`
and `cabling` lay the pod out, `sessions` says who is looking, `app` serves the pages.
"""
