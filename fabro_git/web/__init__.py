"""`git fabro serve`: a browser view of this repository's runs, live or finished.

An ASGI app (Starlette) on Hypercorn's trio worker. It reads runs only through the run
source it is given (the run reader) and acts on a live run only through its control
socket, as `attach`, `steer` and `interrupt` do. The page is static files shipped in
this package, run data reaches it only as JSON and is put into the page as text.
"""
