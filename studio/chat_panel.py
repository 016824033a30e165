"""The conversation's components (issue 44, item 4): its state, the bubbles, the turn selector, the
follow-up and New conversation (chat_panel), and the system prompt in Settings (system_box).

Components only: studio.conversation has their handlers and wires them.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from specfuse.limits import MAX_MESSAGES, MAX_PROMPT_CHARS

from .chat_views import Chat, bubbles_html


@dataclass
class ChatPanel:
    """The conversation's components: its state, bubbles, turn selector, follow-up and New."""

    state: gr.State
    bubbles: gr.HTML
    turn: gr.Dropdown
    followup: gr.Textbox
    ask: gr.Button
    new: gr.Button

    def outputs(self) -> list[gr.components.Component]:
        """What every run changes: the conversation, its bubbles, the turn shown."""
        return [self.state, self.bubbles, self.turn]


def system_box() -> gr.Textbox:
    """The system prompt, in Settings: the conversation's system message (bounded as a prompt is)."""
    return gr.Textbox(
        "",
        label="System prompt",
        info="Every member gets it as the conversation's system message (each in its own chat template).",
        lines=2,
        max_length=MAX_PROMPT_CHARS,
        placeholder="empty: none",
        elem_id="chat-system",
    )


def chat_panel() -> ChatPanel:
    """The bubbles, the turn whose rounds the panels show, and the follow-up under them."""
    with gr.Accordion("Conversation", open=True, elem_id="chat"):
        state = gr.State(Chat())
        bubbles = gr.HTML(bubbles_html(Chat()), elem_id="chat-bubbles")
        turn = gr.Dropdown(
            [], value=None, label="Turn shown in the panels", interactive=True, elem_id="chat-turn"
        )
        followup = gr.Textbox(
            label="Ask a follow-up",
            lines=2,
            max_length=MAX_PROMPT_CHARS,
            info=f"The members see the whole conversation: at most {MAX_MESSAGES} messages.",
            elem_id="chat-followup",
        )
        with gr.Row():
            ask = gr.Button("Ask a follow-up", variant="primary", elem_id="chat-ask")
            new = gr.Button("New conversation", elem_id="chat-new")
    return ChatPanel(state, bubbles, turn, followup, ask, new)
