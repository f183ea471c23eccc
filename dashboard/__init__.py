"""``dlsub dashboard``: web pages of a user's jobs, the cluster and the simulator.

Served by FastAPI and uvicorn on 127.0.0.1 only, behind a random token;
pages are rendered on the server (Jinja2 templates, inline SVG charts) and
read without JavaScript; htmx, installed from the npm registry with dlsub
and served from here, only refreshes parts of them live.
"""
