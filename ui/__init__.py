"""The Gradio UI: chat with the tool-using model and browse evaluation runs. Talks to the API over HTTP only."""
