"""OpenAI's chat dialect: `POST /v1/chat/completions` and `GET /v1/models` (routes) on the same core (completions)."""
