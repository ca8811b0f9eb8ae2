"""The API dialects the server speaks over its one core: OpenAI's chat completions (chat)."""
