"""Chat templates in the formats two model families were trained on, written for the tests (the
hub's own files cannot be fetched here): Qwen3's (ChatML; tools listed in the system turn inside
<tools></tools>, calls as <tool_call> JSON, results as <tool_response> in a user turn; an empty
think block when enable_thinking is false) and Llama 3.1's JSON tool calling (tools in the first
user turn, a call as {"name", "parameters"}, results in an ipython turn)."""

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        '<args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + (message.content or '') }}
        {%- for call in message.tool_calls or [] %}
            {%- if (loop.first and message.content) or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

LLAMA31_JSON = r"""{{- bos_token }}
{%- set system = '' %}
{%- if messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools %}
    {{- 'Environment: ipython\n' }}
{%- endif %}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' + system + '<|eot_id|>' }}
{%- for message in messages %}
    {%- if message.role == 'user' and loop.first and tools %}
        {{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a '
            'JSON for a function call with its proper arguments that best answers the given prompt.\n\n'
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
            'value}. Do not use variables.\n\n' }}
        {%- for tool in tools %}
            {{- tool | tojson(indent=4) + '\n\n' }}
        {%- endfor %}
        {{- message.content | trim + '<|eot_id|>' }}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {%- if message.tool_calls | length > 1 %}
            {{- raise_exception('Llama 3.1 calls one tool at a time') }}
        {%- endif %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + call.name + '", "parameters": ' }}
        {{- call.arguments | tojson + '}<|eot_id|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + {'output': message.content} | tojson + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"""
