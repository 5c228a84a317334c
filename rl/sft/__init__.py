"""The non-reasoning SFT stage that teaches the tool format before RL: a problem catalogue (`catalogue`), the
data builder whose programs run in the sandbox (`data`), conversations encoded as the server serves them
(`encoding`) and the trainer (`train`)."""
