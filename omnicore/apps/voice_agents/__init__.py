"""Voice-agent frameworks driving `omnicore serve` through its WebSocket for voice agents
(/v1/audio/speech/stream-input): the LLM's text goes in as it is written, the server's stream
cuts it into sentences and speaks each as soon as it is whole, and a barge-in cancels within a
step. Each adapter is a framework's own TTS class (the `voice-agents` extra installs both):

    livekit_tts.py    omnicore.apps.voice_agents.livekit_tts.TTS, a LiveKit Agents `tts.TTS` that
                      streams (no StreamAdapter, no request per sentence)
    pipecat_tts.py    omnicore.apps.voice_agents.pipecat_tts.OmnicoreTTSService, a Pipecat
                      websocket TTS service that takes the LLM's tokens as they come
    speech_socket.py  the socket's messages, shared by both: the speech settings, text,
                      flush, cancel and close in; audio, `audio.done` and errors out

The frameworks' stock OpenAI TTS classes work too, unchanged, against `omnicore serve`'s
/v1/audio/speech (docs/integrations.md); these adapters are what make the text side stream.
"""
