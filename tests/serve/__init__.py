"""The OpenAI-compatible API: endpoints, bodies, streams, clients of the ecosystem."""
