"""The web page of a peer: its metrics port answers `/` with the peer's own view, `/api/status` with its snapshot.

`views.py` turns a snapshot (the dict the status socket serves) into the cells of the page's components: the run,
the peers table, the throughput and loss curves, the averaging rounds table. `render.py` renders them server-side
with Jinja2 (autoescape: every string a peer publishes is escaped); `templates/components.html` holds one macro per
component, so a page of many peers (the monitor's) is the same macros over more rows. `app.py` is the WSGI app
(`/`, `/api/status`, `/static/`, and /metrics handed to prometheus_client), `server.py` the threaded HTTP server it
runs on. `static/` holds the page's script and style and uPlot, vendored from its npm package (static/README.md).
No torch or hivemind import: the metrics thread serves this.
"""
