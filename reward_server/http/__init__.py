"""The HTTP layer: the FastAPI app and its routes (app), errors as HTTP answers (errors), request
bodies read as they stream in (body), how the body limits derive from the settings (limits), and
the uvicorn process around it all: connection guards, drain on SIGTERM, a bounded exit
(connections)."""
