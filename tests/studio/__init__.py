"""The app without a browser: its values, handlers and API through gradio_client."""
