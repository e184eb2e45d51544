// The official openai package against a running kvserve: completions and chat, plain and
// streamed, with usage. KVSERVE_URL (e.g. http://127.0.0.1:8080) and KVSERVE_MODEL_ID are set
// by tests/openai_client_test.sh. Exits non-zero on the first failed check.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: `${process.env.KVSERVE_URL}/v1`, apiKey: 'test-key' });
const model = process.env.KVSERVE_MODEL_ID;

const models = await client.models.list();
assert.equal(models.data[0].id, model);

const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
assert.match(c.choices[0].text, /^, there was/);
assert.equal(c.usage.completion_tokens, 8);
assert.equal(c.usage.prompt_tokens, 5);
console.log('ok - completions:', JSON.stringify(c.choices[0].text));

let streamed = '', usage = null;
const cs = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
                                             stream: true, stream_options: { include_usage: true } });
for await (const chunk of cs) {
  if (chunk.choices.length) streamed += chunk.choices[0].text;
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(streamed, c.choices[0].text);
assert.equal(usage.completion_tokens, 8);
console.log('ok - completions streamed, usage', JSON.stringify(usage));

const messages = [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
assert.equal(chat.choices[0].message.role, 'assistant');
assert.ok(chat.choices[0].message.content.length > 0);
assert.equal(chat.usage.completion_tokens, 10);
console.log('ok - chat:', JSON.stringify(chat.choices[0].message.content));

let chatStreamed = '', chatUsage = null, finish = null;
const stream = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
for await (const chunk of stream) {
  if (chunk.choices.length) {
    chatStreamed += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) chatUsage = chunk.usage;
}
assert.equal(chatStreamed, chat.choices[0].message.content);
assert.equal(finish, 'length');
assert.equal(chatUsage.completion_tokens, 10);
assert.equal(chatUsage.prompt_tokens, chat.usage.prompt_tokens);
console.log('ok - chat streamed, usage', JSON.stringify(chatUsage));

await assert.rejects(client.completions.create({ model, prompt: 'x', temperature: 7 }),
                     (e) => e.status === 400 && /temperature/.test(e.message));
console.log('ok - a bad parameter is a 400 the client reports');
