"""The API dialects the server speaks over its one core: /score and /score/batch (score), OpenAI's
chat completions (chat). Each translates its protocol; the core admits the work and keeps the
deadline."""
