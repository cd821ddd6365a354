"""How many tokens to draft per step: the policy protocol and a fixed γ (`policy`), `AutoGamma` ("auto": `auto`),
`SimpleGamma` ("auto_simple": `simple`), the acceptance estimate they choose with (`estimate`), the break-even
acceptance (`break_even`), the measured cost model (`cost_model`) and the choice between them (`factory`)."""
