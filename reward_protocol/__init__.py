"""The wire protocol of the reward service, imported by the server and the client alike.

Light (numpy, pydantic, orjson): score requests and answers (`score`), the raw batch body
(`raw_batch`), the frame rule (`frames`), the progress-curve rule (`progress`), the bounded JSON
decoder every body goes through (`bounded_json`) and the OpenAI chat dialect's models (`chat`).
"""
