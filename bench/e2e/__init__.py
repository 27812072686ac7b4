"""`tao bench e2e`: play an agent trace against a live OpenAI-compatible endpoint."""
