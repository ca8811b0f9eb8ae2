"""The scoring dialect: `POST /score` and `POST /score/batch` (routes), episodes judged over the core (scoring)."""
