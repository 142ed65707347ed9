"""The operator page `/ui`: read-only, server-rendered HTML with an inline SVG plot, no JavaScript.

`view` reads what the page shows from the database (through `crud`), `pages` and `plot` turn it
into HTML, `session` signs the login cookie. The routes are in `server_api/api/routes/ui.py`.
"""
