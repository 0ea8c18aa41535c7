// The carmy console (protocol.md §10): a client of the public carmy/1 API and nothing more.
// It sees what the caller's token sees, builds a form from each tool's input schema, runs the
// tool over Server-Sent Events and shows the answer. No build step: this file is served as is.
'use strict';

(() => {
  const TOKEN_KEY = 'carmy.console.token';
  const EVENT_TYPES = ['execution.finished', 'health.changed', 'tools.changed', 'subscription.disabled'];

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    discovery: null,
    tools: [],
    /** Whether the caller may manage event subscriptions (the list answered 200). */
    events: false,
    /** The run in flight: its AbortController, so leaving or stopping closes the stream. */
    running: null,
  };

  // ---- DOM helpers ---------------------------------------------------------------------

  const $ = (selector, root = document) => root.querySelector(selector);
  let uniqueId = 0;
  const nextId = (prefix) => `${prefix}-${++uniqueId}`;

  /** An element with attributes (`on…` listeners, `text`, `class`) and children. */
  function h(tag, props, ...children) {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') element.className = value;
      else if (key === 'text') element.textContent = value;
      else if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
      else element.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : String(child));
    }
    return element;
  }

  /** Text with its `backticked` spans as code, as doc comments write them. */
  const rich = (text) => String(text).split(/`([^`]+)`/).map((part, index) => (index % 2 ? code(part) : part));
  const badge = (text, kind) => h('span', { class: `badge ${kind || ''}`.trim(), text });
  const pretty = (value) => JSON.stringify(value, null, 2);
  const code = (text) => h('code', { text });

  function showBanner(text) {
    const banner = $('#banner');
    banner.textContent = text;
    banner.hidden = !text;
  }

  /** 16 random bytes as hex: a request id (crypto.randomUUID needs a secure context). */
  function freshRequestId() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return `console-${Array.from(bytes, (byte) => byte.toString(16).padStart(2, '0')).join('')}`;
  }

  // ---- The API ---------------------------------------------------------------------------

  function headers(extra) {
    const all = new Headers(extra);
    if (state.token) all.set('Authorization', `Bearer ${state.token}`);
    return all;
  }

  async function readJson(response) {
    const text = await response.text();
    if (!text) return null;
    try {
      return JSON.parse(text);
    } catch {
      return null;
    }
  }

  /** GET `url` as JSON (revalidated: the documents carry ETags). */
  async function getJson(url) {
    const response = await fetch(url, { headers: headers({ Accept: 'application/json' }), cache: 'no-cache' });
    return { response, body: await readJson(response) };
  }

  async function sendJson(method, url, body) {
    const init = { method, headers: headers({ Accept: 'application/json' }) };
    if (body !== undefined) {
      init.headers.set('Content-Type', 'application/json');
      init.body = JSON.stringify(body);
    }
    const response = await fetch(url, init);
    return { response, body: await readJson(response) };
  }

  /** The `{code, message}` of an error body, or a description of what came instead. */
  function errorOf(response, body) {
    if (body && body.error) return body.error;
    return { code: `HTTP_${response.status}`, message: response.statusText || 'unexpected answer' };
  }

  /** Server-Sent Events from a fetch response, as `{event, id, data}` with `data` parsed. */
  async function* serverEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = { event: 'message', id: null, data: [] };
        for (const line of block.split('\n')) {
          if (!line || line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'event') event.event = text;
          else if (field === 'id') event.id = text;
          else if (field === 'data') event.data.push(text);
        }
        if (event.data.length === 0) continue;
        try {
          yield { event: event.event, id: event.id, data: JSON.parse(event.data.join('\n')) };
        } catch {
          // Not carmy's JSON: skipped.
        }
      }
    }
  }

  // ---- Loading ---------------------------------------------------------------------------

  async function load() {
    showBanner('');
    $('#caller').textContent = state.token ? 'Calling with a token' : 'Anonymous';
    $('#token-clear').hidden = !state.token;
    try {
      const discovery = await getJson('/.well-known/agent');
      if (!discovery.response.ok || !discovery.body) {
        const error = errorOf(discovery.response, discovery.body);
        state.discovery = null;
        state.tools = [];
        showBanner(
          error.code === 'UNAUTHENTICATED'
            ? `The token was refused: ${error.message}. Correct it, or forget it to call anonymously.`
            : `Discovery failed: ${error.code}: ${error.message}`,
        );
        renderToolList();
        route();
        return;
      }
      state.discovery = discovery.body;
      const name = state.discovery.server;
      $('#server-name').textContent = name;
      document.title = `${name} · carmy console`;
      const catalog = await getJson(state.discovery.tools_url);
      state.tools = catalog.response.ok && catalog.body ? catalog.body.tools : [];
      if (!catalog.response.ok) {
        const error = errorOf(catalog.response, catalog.body);
        showBanner(`The tools could not be listed: ${error.code}: ${error.message}`);
      }
      await probeEvents();
    } catch (failure) {
      showBanner(`The server could not be reached: ${failure.message}`);
    }
    const capabilities = state.discovery ? state.discovery.capabilities : [];
    $('#nav-executions').hidden = !capabilities.includes('executions');
    $('#nav-health').hidden = !capabilities.includes('health');
    $('#nav-events').hidden = !state.events;
    renderToolList();
    refreshHealth();
    route();
  }

  /**
   * Event subscriptions are shown to those who may manage them. The console's session route
   * says who the caller is, so the page never requests a route that would answer it 404.
   */
  async function probeEvents() {
    state.events = false;
    if (!state.token || !state.discovery.capabilities.includes('events')) return;
    const { response, body } = await getJson(`${state.discovery.console_url}session`);
    state.events = response.ok && body !== null && body.manage_events === true;
  }

  // ---- The tool list ---------------------------------------------------------------------

  function effectLabel(effect) {
    return effect.replace('_', ' ');
  }

  function toolBadges(tool) {
    return h(
      'span',
      { class: 'badges' },
      badge(effectLabel(tool.effect), `effect-${tool.effect}`),
      tool.idempotent ? badge('idempotent', 'info') : null,
      tool.confirmation === 'required' ? badge('needs confirmation', 'bad') : null,
      tool.mode === 'async' ? badge('async', 'info') : null,
    );
  }

  function summaryOf(description) {
    const first = (description || '').split(/\n\s*\n/)[0].replace(/\s+/g, ' ').trim();
    return first.length > 110 ? `${first.slice(0, 107)}…` : first;
  }

  function renderToolList() {
    const query = $('#search').value.trim().toLowerCase();
    const shown = state.tools.filter(
      (tool) => !query || tool.name.toLowerCase().includes(query) || (tool.description || '').toLowerCase().includes(query),
    );
    const current = currentTool();
    $('#tool-list').replaceChildren(
      ...shown.map((tool) =>
        h(
          'li',
          null,
          h(
            'a',
            { href: `#/tools/${encodeURIComponent(tool.name)}`, 'aria-current': tool.name === current ? 'page' : null },
            h('span', { class: 'tool-name', text: tool.name }),
            h('span', { class: 'tool-summary', text: summaryOf(tool.description) }),
            toolBadges(tool),
          ),
        ),
      ),
    );
    const total = state.tools.length;
    $('#tool-count').textContent = query
      ? `${shown.length} of ${total} tools match`
      : `${total} tool${total === 1 ? '' : 's'} available to this caller`;
  }

  function currentTool() {
    const match = /^#\/tools\/(.+)$/.exec(location.hash);
    return match ? decodeURIComponent(match[1]) : null;
  }

  // ---- Views -----------------------------------------------------------------------------

  function route() {
    if (state.running) state.running.abort();
    state.running = null;
    const hash = location.hash;
    for (const link of document.querySelectorAll('.views a')) {
      link.setAttribute('aria-current', link.getAttribute('href') === hash ? 'page' : 'false');
    }
    renderToolList();
    const main = $('#main');
    const name = currentTool();
    if (name !== null) {
      const tool = state.tools.find((candidate) => candidate.name === name);
      main.replaceChildren(tool ? toolView(tool) : missingTool(name));
    } else if (hash === '#/executions') {
      main.replaceChildren(executionsView());
    } else if (hash === '#/health') {
      main.replaceChildren(healthView());
    } else if (hash === '#/events' && state.events) {
      main.replaceChildren(eventsView());
    } else {
      main.replaceChildren(overview());
    }
  }

  function overview() {
    const discovery = state.discovery;
    return h(
      'section',
      { class: 'card' },
      h('h2', { text: discovery ? discovery.server : 'carmy console' }),
      h(
        'p',
        null,
        'Every tool this caller may use is listed on the left. Pick one to read what it does, fill in its form and press ',
        h('strong', { text: 'Run' }),
        '. The console calls the same API agents use, with your token and nothing more.',
      ),
      discovery
        ? h(
            'p',
            { class: 'muted small' },
            `Protocol ${discovery.protocol} · capabilities: ${discovery.capabilities.join(', ')} · agents start at `,
            h('a', { href: '/agent/tools', text: discovery.tools_url }),
          )
        : null,
    );
  }

  function missingTool(name) {
    return h(
      'section',
      { class: 'card' },
      h('h2', { text: name }),
      h('p', { text: 'No tool of this name is available to this caller. A token with more trust may see it.' }),
    );
  }

  // ---- One tool: its form, its run ------------------------------------------------------

  function toolView(tool) {
    const form = h('form', { novalidate: true, 'aria-label': `Run ${tool.name}` });
    const root = schemaForm(tool.input_schema);
    const raw = h('textarea', { id: nextId('raw'), spellcheck: 'false', 'aria-describedby': null });
    const rawField = h(
      'div',
      { class: 'field', hidden: true },
      h('label', { for: raw.id, text: 'arguments' }),
      h('p', { class: 'help', text: 'The arguments object, as JSON. It is sent as typed.' }),
      raw,
    );
    const fieldsBox = h('div', { class: 'fields' }, root.controls.length ? root.controls : h('p', { class: 'muted', text: 'This tool takes no input.' }));
    let rawMode = false;
    const formButton = h('button', { type: 'button', 'aria-pressed': 'true', text: 'Form' });
    const jsonButton = h('button', { type: 'button', 'aria-pressed': 'false', text: 'JSON' });
    const setMode = (toRaw) => {
      if (toRaw === rawMode) return;
      if (toRaw) {
        raw.value = pretty(root.read().value ?? {});
      } else {
        try {
          root.fill(JSON.parse(raw.value || '{}'));
        } catch {
          // Kept as typed in the JSON box; the form keeps its own values.
        }
      }
      rawMode = toRaw;
      formButton.setAttribute('aria-pressed', String(!toRaw));
      jsonButton.setAttribute('aria-pressed', String(toRaw));
      fieldsBox.hidden = toRaw;
      rawField.hidden = !toRaw;
    };
    formButton.addEventListener('click', () => setMode(false));
    jsonButton.addEventListener('click', () => setMode(true));

    const requestId = h('input', { id: nextId('request-id'), spellcheck: 'false', 'aria-describedby': null });
    const requestHelp = h('p', {
      class: 'help',
      id: nextId('help'),
      text: 'Sent with the call: a retry with the same id never runs the tool twice. A new id comes with new arguments; leave it empty to send none.',
    });
    requestId.setAttribute('aria-describedby', requestHelp.id);
    if (!tool.idempotent && tool.effect !== 'none' && tool.effect !== 'read') requestId.value = freshRequestId();
    const capabilities = state.discovery.capabilities;
    const canDetach = capabilities.includes('executions') && tool.mode !== 'sync';
    const background = h('input', { type: 'checkbox', id: nextId('background'), checked: tool.mode === 'async', disabled: tool.mode === 'async' });

    const outcome = h('div', { class: 'outcome', 'aria-live': 'polite' });
    const runButton = h('button', { type: 'submit', class: 'primary', text: 'Run' });
    const stopButton = h('button', { type: 'button', text: 'Stop', hidden: true });
    const confirmBox = h('div', { class: 'confirm', hidden: true, role: 'group', 'aria-label': 'Confirm the run' });
    let confirmed = false;
    /**
     * The request id of the last run. The field keeps showing it, so it matches the id in the
     * result and running the same call again is a safe retry; a change to the arguments makes
     * a new call, which gets a new id.
     */
    let sentId = null;
    form.addEventListener('input', (event) => {
      if (event.target === requestId || event.target === background) return;
      if (sentId && requestId.value.trim() === sentId) requestId.value = freshRequestId();
      sentId = null;
    });

    const run = async () => {
      clearFieldErrors(form);
      let args;
      if (rawMode) {
        try {
          args = JSON.parse(raw.value || '{}');
        } catch (failure) {
          outcome.replaceChildren(resultCard('bad', 'Not JSON', [h('p', { text: `The arguments are not valid JSON: ${failure.message}` })]));
          return;
        }
      } else {
        args = root.read().value ?? {};
      }
      const id = requestId.value.trim();
      sentId = id;
      const body = { tool: tool.name, arguments: args };
      if (id) body.request_id = id;
      const detach = canDetach && background.checked;
      const controller = new AbortController();
      state.running = controller;
      runButton.disabled = true;
      stopButton.hidden = detach;
      const live = runningCard(tool.name);
      outcome.replaceChildren(live.card);
      const finish = () => {
        runButton.disabled = false;
        stopButton.hidden = true;
        if (state.running === controller) state.running = null;
      };
      let response;
      try {
        response = await fetch(state.discovery.execute_url, {
          method: 'POST',
          headers: headers({
            'Content-Type': 'application/json',
            Accept: detach ? 'application/json' : 'text/event-stream',
            'Carmy-Channel': 'human',
            ...(detach ? { Prefer: 'respond-async' } : {}),
          }),
          body: JSON.stringify(body),
          signal: controller.signal,
        });
      } catch (failure) {
        finish();
        outcome.replaceChildren(transportFailure(failure, controller, id));
        return;
      }
      try {
        const type = response.headers.get('Content-Type') || '';
        if (type.startsWith('text/event-stream')) {
          const ended = await follow(response, live, controller);
          if (ended) {
            showAnswer(outcome, ended.body, { replayed: ended.replayed, requestId: id, form, root, args, rawMode });
          }
        } else {
          const answer = await readJson(response);
          if (response.status === 202 && answer) {
            outcome.replaceChildren(detachedCard(answer));
          } else {
            showAnswer(outcome, answer || { error: errorOf(response, answer) }, {
              replayed: response.headers.get('Carmy-Replayed') === 'true',
              requestId: id,
              form,
              root,
              args,
              rawMode,
            });
          }
        }
      } catch (failure) {
        outcome.replaceChildren(transportFailure(failure, controller, id));
      } finally {
        finish();
      }
    };

    const askConfirmation = () => {
      const go = h('button', { type: 'button', class: 'primary', text: 'Confirm and run' });
      const back = h('button', { type: 'button', text: 'Back' });
      confirmBox.replaceChildren(
        h(
          'p',
          null,
          h('strong', { text: tool.name }),
          tool.confirmation === 'required'
            ? ' needs the user\u2019s confirmation'
            : ' changes things that cannot be undone',
          ` (effect: ${effectLabel(tool.effect)}). Run it with these arguments?`,
        ),
        confirmationNote(tool),
        h('div', { class: 'row' }, go, back),
      );
      confirmBox.hidden = false;
      go.addEventListener('click', () => {
        confirmBox.hidden = true;
        confirmed = true;
        run().finally(() => {
          confirmed = false;
        });
      });
      back.addEventListener('click', () => {
        confirmBox.hidden = true;
        runButton.focus();
      });
      go.focus();
    };

    form.addEventListener('submit', (event) => {
      event.preventDefault();
      if (runButton.disabled) return;
      const risky = tool.confirmation === 'required' || tool.effect === 'destructive';
      if (risky && !confirmed) askConfirmation();
      else run();
    });
    stopButton.addEventListener('click', () => state.running && state.running.abort());

    const options = [
      h(
        'div',
        { class: 'field' },
        h('label', { for: requestId.id, text: 'Request id' }),
        h('div', { class: 'row' }, requestId, h('button', { type: 'button', text: 'New id', onclick: () => (requestId.value = freshRequestId()) })),
        requestHelp,
      ),
    ];
    if (canDetach) {
      options.push(
        h(
          'div',
          { class: 'field check' },
          background,
          h('label', { for: background.id, text: 'Run in the background' }),
          h('p', {
            class: 'help',
            text:
              tool.mode === 'async'
                ? 'This tool always runs in the background; follow it under Executions.'
                : 'Answered at once with an execution you can follow, cancel and read back (needs a token).',
          }),
        ),
      );
    }

    form.append(
      h('div', { class: 'row' }, h('div', { class: 'mode', role: 'group', 'aria-label': 'Input mode' }, formButton, jsonButton)),
      fieldsBox,
      rawField,
      h('div', { class: 'options' }, options),
      confirmationNote(tool),
      confirmBox,
      h('div', { class: 'actions' }, runButton, stopButton),
    );

    return h(
      'article',
      { class: 'card' },
      h('div', { class: 'card-head' }, h('h2', { text: tool.name }), toolBadges(tool)),
      h('div', { class: 'description' }, (tool.description || '').split(/\n\s*\n/).map((paragraph) => h('p', null, rich(paragraph)))),
      tool.timeout_ms ? h('p', { class: 'muted small', text: `Deadline: ${tool.timeout_ms / 1000} s` }) : null,
      form,
      outcome,
      h('details', null, h('summary', { text: 'Input schema' }), h('pre', { class: 'json', text: pretty(tool.input_schema) })),
      h('details', null, h('summary', { text: 'Output schema' }), h('pre', { class: 'json', text: pretty(tool.output_schema) })),
    );
  }

  /** What a confirmation-required tool needs besides a click: a token holding its permission. */
  function confirmationNote(tool) {
    if (tool.confirmation !== 'required') return null;
    return h(
      'p',
      { class: 'help confirm-note' },
      'Running it needs a token that holds the permission ',
      code(`confirm:${tool.name}`),
      ': enter one under Token at the top of the page.',
    );
  }

  function transportFailure(failure, controller, requestId) {
    if (controller.signal.aborted) {
      return resultCard('bad', 'Stopped', [
        h('p', { text: 'The stream was closed, which cancels the execution on the server.' }),
      ]);
    }
    return resultCard('bad', 'Connection failed', [
      h('p', { text: `The call did not complete: ${failure.message}.` }),
      requestId
        ? h('p', null, 'Run again: the same request id ', code(requestId), ' makes the retry safe, it never runs twice.')
        : null,
    ]);
  }

  // ---- Running and answers --------------------------------------------------------------

  function resultCard(kind, title, body, extraTitle) {
    return h('div', { class: `result ${kind}` }, h('h3', null, title, extraTitle || null), body);
  }

  /** The card a run fills while it streams: its execution id and a progress bar. */
  function runningCard(toolName) {
    const progress = h('progress', { 'aria-label': `Progress of ${toolName}` });
    const count = h('span', { class: 'small' });
    const message = h('span', { class: 'small muted' });
    const meta = h('div', { class: 'meta' }, h('span', { text: 'Starting…' }));
    const card = resultCard('running', 'Running', [meta, h('div', { class: 'progress-line' }, progress, count, message)]);
    return {
      card,
      started(data) {
        meta.replaceChildren(h('span', null, 'Execution ', code(data.execution_id)));
      },
      progress(data) {
        if (data.total) {
          progress.max = data.total;
          progress.value = Math.min(data.progress, data.total);
          count.textContent = `${data.progress} of ${data.total}`;
        } else {
          progress.removeAttribute('value');
          count.textContent = `${data.progress} done`;
        }
        message.textContent = data.message || '';
      },
    };
  }

  /** Reads a run's events into `live` until `execution.completed`, which it returns. */
  async function follow(response, live, controller) {
    for await (const event of serverEvents(response)) {
      if (controller.signal.aborted) return null;
      if (event.event === 'execution.started') live.started(event.data);
      else if (event.event === 'tool.progress') live.progress(event.data);
      else if (event.event === 'execution.completed') {
        const { replayed, ...body } = event.data;
        return { body, replayed: replayed === true };
      }
    }
    throw new Error('the stream ended before the execution did');
  }

  /** The result (pretty JSON) or the error, with field errors placed next to their fields. */
  function showAnswer(outcome, body, context) {
    const meta = h(
      'div',
      { class: 'meta' },
      body.execution_id ? h('span', null, 'Execution ', code(body.execution_id)) : null,
      context.requestId ? h('span', null, 'Request id ', code(context.requestId)) : null,
    );
    const replayed = context.replayed
      ? badge('replayed', 'info')
      : null;
    const replayNote = context.replayed
      ? h('p', { class: 'small', text: 'Recorded earlier under this request id: the tool did not run again.' })
      : null;
    if (!body.error) {
      outcome.replaceChildren(
        resultCard('ok', 'Completed', [meta, replayNote, h('pre', { class: 'json', 'aria-label': 'Result', text: pretty(body.data) }), nextActions(body)], replayed),
      );
      return;
    }
    const error = body.error;
    const status = body.status ? badge(body.status.replace('_', ' '), 'bad') : null;
    const facts = h(
      'div',
      { class: 'meta' },
      h('span', null, 'Code ', code(error.code)),
      error.category ? h('span', { text: `Category ${error.category}` }) : null,
      h('span', { text: error.retryable ? `Retryable${error.retry_after ? ` after ${error.retry_after} s` : ''}` : 'Not retryable' }),
      error.recoverable ? h('span', { text: 'Change the call to succeed' }) : null,
    );
    const unplaced = [];
    const violations = (error.details && Array.isArray(error.details.errors) && error.details.errors) || [];
    for (const violation of violations) {
      const placed = !context.rawMode && placeFieldError(context.form, context.root, context.args, violation);
      if (!placed) unplaced.push(violation);
    }
    const reason = error.details && typeof error.details.reason === 'string' ? error.details.reason : null;
    outcome.replaceChildren(
      resultCard(
        'bad',
        error.code,
        [
          h('p', { class: 'error-message' }, rich(error.message)),
          reason && reason !== error.message ? h('p', { class: 'small' }, rich(reason)) : null,
          permissionHint(error),
          facts,
          meta,
          replayNote,
          violations.length > unplaced.length ? h('p', { class: 'small', text: 'The fields at fault are marked above.' }) : null,
          unplaced.length
            ? h('ul', { class: 'problems' }, unplaced.map((violation) => h('li', null, violation.path ? code(violation.path) : null, ` ${violation.message}`)))
            : null,
          error.suggested_action
            ? h('p', null, 'Suggested: ', h('a', { href: `#/tools/${encodeURIComponent(error.suggested_action)}`, text: error.suggested_action }))
            : null,
          nextActions(body),
        ],
        status,
      ),
    );
    const firstInvalid = context.form && context.form.querySelector('[aria-invalid="true"]');
    if (firstInvalid) firstInvalid.focus();
  }

  /** A refusal that a token with a permission would pass names the permission to ask for. */
  function permissionHint(error) {
    const permission = error.details && typeof error.details.permission === 'string' ? error.details.permission : null;
    if (!permission) return null;
    return h(
      'p',
      { class: 'small' },
      state.token ? 'The token in use does not hold ' : 'Anonymous callers do not hold ',
      code(permission),
      ': enter a token that does under Token at the top of the page, then run again.',
    );
  }

  function nextActions(body) {
    const actions = body._agent && body._agent.next_actions;
    if (!actions || !actions.length) return null;
    return h(
      'div',
      null,
      h('h3', { text: 'Next' }),
      h(
        'ul',
        { class: 'problems' },
        actions.map((action) => h('li', null, h('a', { href: `#/tools/${encodeURIComponent(action.tool)}`, text: action.tool }), ' — ', rich(action.reason))),
      ),
    );
  }

  /** A run started in the background: followed live from its events, cancellable. */
  function detachedCard(accepted) {
    const box = h('div');
    const live = runningCard(accepted.tool);
    const cancel = h('button', { type: 'button', class: 'danger', text: 'Cancel execution' });
    cancel.addEventListener('click', () => cancelExecution(accepted.execution_id, cancel));
    box.append(
      h('p', null, 'Running in the background as ', code(accepted.execution_id), '. It goes on if you leave; find it under ', h('a', { href: '#/executions', text: 'Executions' }), '.'),
      live.card,
      h('div', { class: 'actions' }, cancel),
    );
    const result = h('div', { class: 'outcome' });
    box.append(result);
    watchExecution(accepted.execution_id, live, result, cancel);
    return box;
  }

  async function watchExecution(executionId, live, result, cancel) {
    const controller = new AbortController();
    state.running = controller;
    try {
      const response = await fetch(`${state.discovery.executions_url}/${encodeURIComponent(executionId)}/events`, {
        headers: headers({ Accept: 'text/event-stream' }),
        signal: controller.signal,
      });
      if (!response.ok) {
        const body = await readJson(response);
        showAnswer(result, { error: errorOf(response, body) }, {});
        return;
      }
      const ended = await follow(response, live, controller);
      if (ended) {
        live.card.hidden = true;
        if (cancel) cancel.hidden = true;
        showAnswer(result, ended.body, { replayed: false });
      }
    } catch (failure) {
      if (!controller.signal.aborted) showAnswer(result, { error: { code: 'STREAM_LOST', message: failure.message } }, {});
    } finally {
      if (state.running === controller) state.running = null;
    }
  }

  async function cancelExecution(executionId, button) {
    button.disabled = true;
    const { response, body } = await sendJson('DELETE', `${state.discovery.executions_url}/${encodeURIComponent(executionId)}`);
    button.textContent = response.status === 202 ? 'Cancellation requested' : errorOf(response, body).message;
  }

  // ---- The form generated from a JSON Schema --------------------------------------------

  /**
   * A control for `schema`: `controls` (elements), `read()` → `{present, value}` registering
   * each field's element under its JSON pointer, and `fill(value)` from the JSON box.
   */
  function schemaForm(rootSchema) {
    const resolve = (schema) => {
      let seen = 0;
      while (schema && typeof schema.$ref === 'string' && schema.$ref.startsWith('#/') && seen++ < 32) {
        schema = schema.$ref
          .slice(2)
          .split('/')
          .reduce((node, key) => (node ? node[key.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined), rootSchema);
      }
      return schema || {};
    };
    /** The schema without its `null` alternative (an `Option`), and whether it had one. */
    const unwrap = (schema) => {
      schema = resolve(schema);
      const alternatives = schema.anyOf || schema.oneOf;
      if (Array.isArray(alternatives) && alternatives.length === 2) {
        const other = alternatives.find((branch) => resolve(branch).type !== 'null');
        if (other && alternatives.some((branch) => resolve(branch).type === 'null')) {
          return { schema: { ...resolve(other), description: schema.description || resolve(other).description }, nullable: true };
        }
      }
      if (Array.isArray(schema.type)) {
        const types = schema.type.filter((type) => type !== 'null');
        if (types.length === 1) return { schema: { ...schema, type: types[0] }, nullable: schema.type.includes('null') };
      }
      return { schema, nullable: false };
    };
    const choices = (schema) => {
      if (Array.isArray(schema.enum)) return schema.enum.map((value) => ({ value, description: null }));
      const branches = schema.oneOf || schema.anyOf;
      if (Array.isArray(branches) && branches.length && branches.every((branch) => 'const' in resolve(branch))) {
        return branches.map((branch) => ({ value: resolve(branch).const, description: resolve(branch).description || null }));
      }
      return null;
    };

    /** One property: label, help, control, and a place for its error. */
    function field(name, rawSchema, required, depth) {
      const { schema } = unwrap(rawSchema);
      const id = nextId('field');
      const helpId = `${id}-help`;
      const describe = (...parts) => parts.filter(Boolean).join(' ');
      const type = schema.type;
      const options = choices(schema);
      const helpText = (extra) => {
        const text = describe(schema.description, extra);
        return h('p', { class: 'help', id: helpId, hidden: !text }, text ? rich(text) : null);
      };
      const marker = required ? null : h('span', { class: 'optional', text: 'optional' });

      if (type === 'object' && schema.properties && depth < 8) {
        const inner = objectControls(schema, depth + 1);
        const legend = h('legend', { text: name });
        const element = h('fieldset', { class: 'field' }, legend, marker, schema.description ? helpText() : null, h('div', { class: 'fields' }, inner.controls));
        return {
          element,
          read(path, registry) {
            registry.set(path, element);
            const value = inner.read(path, registry);
            return { present: required || Object.keys(value).length > 0, value };
          },
          fill: inner.fill,
        };
      }

      if (type === 'array' && schema.items && depth < 8) {
        const items = [];
        const list = h('div', { class: 'fields' });
        const add = h('button', { type: 'button', text: `Add ${name} item` });
        const element = h('fieldset', { class: 'field' }, h('legend', { text: name }), marker, helpText(bounds(schema, 'items')), list, h('div', null, add));
        const addItem = (value) => {
          const item = field(`${name} ${items.length + 1}`, schema.items, true, depth + 1);
          const remove = h('button', { type: 'button', class: 'link', text: 'Remove' });
          const row = h('div', { class: 'item' }, item.element, remove);
          const entry = { item, row };
          remove.addEventListener('click', () => {
            items.splice(items.indexOf(entry), 1);
            row.remove();
            add.focus();
          });
          items.push(entry);
          list.append(row);
          if (value !== undefined) item.fill(value);
          return item;
        };
        add.addEventListener('click', () => {
          const item = addItem();
          const first = item.element.querySelector('input, select, textarea');
          if (first) first.focus();
        });
        return {
          element,
          read(path, registry) {
            registry.set(path, element);
            const value = items.map((entry, index) => {
              const read = entry.item.read(`${path}/${index}`, registry);
              return read.present ? read.value : null;
            });
            return { present: required || value.length > 0, value };
          },
          fill(value) {
            items.splice(0).forEach((entry) => entry.row.remove());
            if (Array.isArray(value)) value.forEach((entry) => addItem(entry));
          },
        };
      }

      const label = h('label', { for: id, text: name });
      const labelRow = h('div', { class: 'label-row' }, label, marker);

      if (options) {
        const select = h(
          'select',
          { id, 'aria-describedby': helpId },
          h('option', { value: '', text: required ? 'Choose…' : '(none)' }),
          options.map((option, index) => h('option', { value: String(index), text: typeof option.value === 'string' ? option.value : JSON.stringify(option.value) })),
        );
        const descriptions = options.filter((option) => option.description).map((option) => `${JSON.stringify(option.value)}: ${option.description}`);
        return leaf(h('div', { class: 'field' }, labelRow, select, helpText(descriptions.join(' · '))), {
          read: () => (select.value === '' ? { present: false } : { present: true, value: options[Number(select.value)].value }),
          fill: (value) => {
            const index = options.findIndex((option) => JSON.stringify(option.value) === JSON.stringify(value));
            select.value = index < 0 ? '' : String(index);
          },
        });
      }

      if (type === 'boolean') {
        if (required) {
          const box = h('input', { type: 'checkbox', id, 'aria-describedby': helpId });
          return leaf(h('div', { class: 'field check' }, box, label, helpText()), {
            read: () => ({ present: true, value: box.checked }),
            fill: (value) => {
              box.checked = value === true;
            },
          });
        }
        const select = h('select', { id, 'aria-describedby': helpId }, h('option', { value: '', text: '(none)' }), h('option', { value: 'true', text: 'true' }), h('option', { value: 'false', text: 'false' }));
        return leaf(h('div', { class: 'field' }, labelRow, select, helpText()), {
          read: () => (select.value === '' ? { present: false } : { present: true, value: select.value === 'true' }),
          fill: (value) => {
            select.value = typeof value === 'boolean' ? String(value) : '';
          },
        });
      }

      if (type === 'integer' || type === 'number') {
        // Text, not type=number: the form sends exactly what was typed, and the server's
        // validation says what is wrong with it.
        const input = h('input', {
          id,
          inputmode: type === 'integer' ? 'numeric' : 'decimal',
          autocomplete: 'off',
          'aria-describedby': helpId,
          placeholder: schema.default !== undefined ? `default ${JSON.stringify(schema.default)}` : null,
        });
        return leaf(h('div', { class: 'field' }, labelRow, input, helpText(numberBounds(schema, type))), {
          read: () => {
            const text = input.value.trim();
            if (text === '') return { present: false };
            const number = Number(text);
            return { present: true, value: Number.isFinite(number) ? number : input.value };
          },
          fill: (value) => {
            input.value = value === undefined || value === null ? '' : String(value);
          },
        });
      }

      if (type === 'string') {
        const input = h('input', {
          id,
          autocomplete: 'off',
          spellcheck: 'false',
          'aria-describedby': helpId,
          placeholder: schema.default !== undefined ? `default ${JSON.stringify(schema.default)}` : schema.format || null,
        });
        return leaf(h('div', { class: 'field' }, labelRow, input, helpText(bounds(schema, 'characters'))), {
          // Empty is "not given" (the JSON box sends an empty string).
          read: () => (input.value === '' ? { present: false } : { present: true, value: input.value }),
          fill: (value) => {
            input.value = typeof value === 'string' ? value : '';
          },
        });
      }

      // Anything else (a map, a union of objects, a schema without a type): JSON, sent as typed.
      const area = h('textarea', { id, spellcheck: 'false', 'aria-describedby': helpId });
      return leaf(h('div', { class: 'field' }, labelRow, area, helpText('A JSON value.')), {
        read: () => {
          if (area.value.trim() === '') return { present: false };
          try {
            return { present: true, value: JSON.parse(area.value) };
          } catch {
            return { present: true, value: area.value };
          }
        },
        fill: (value) => {
          area.value = value === undefined ? '' : pretty(value);
        },
      });
    }

    /** A field of one control: `read` registers its box under the path. */
    function leaf(element, control) {
      return {
        element,
        read(path, registry) {
          registry.set(path, element);
          return control.read();
        },
        fill: control.fill,
      };
    }

    function objectControls(schema, depth) {
      const required = new Set(schema.required || []);
      const fields = Object.entries(schema.properties || {}).map(([name, property]) => ({
        name,
        field: field(name, property, required.has(name), depth),
      }));
      return {
        controls: fields.map((entry) => entry.field.element),
        read(path, registry) {
          const value = {};
          for (const { name, field: child } of fields) {
            const read = child.read(`${path}/${name.replace(/~/g, '~0').replace(/\//g, '~1')}`, registry);
            if (read.present) value[name] = read.value;
          }
          return value;
        },
        fill(value) {
          for (const { name, field: child } of fields) child.fill(value && typeof value === 'object' ? value[name] : undefined);
        },
      };
    }

    const root = objectControls(resolve(rootSchema), 0);
    let registry = new Map();
    return {
      controls: root.controls,
      read() {
        registry = new Map();
        return { present: true, value: root.read('', registry) };
      },
      fill: root.fill,
      /** The box of the field at `pointer`, as of the last `read`. */
      fieldAt: (pointer) => registry.get(pointer) || null,
      schemaAt(pointer) {
        let schema = unwrap(rootSchema).schema;
        for (const key of pointer.split('/').slice(1)) {
          const name = key.replace(/~1/g, '/').replace(/~0/g, '~');
          schema = unwrap(schema.type === 'array' ? schema.items : (schema.properties || {})[name]).schema;
        }
        return schema;
      },
    };
  }

  function numberBounds(schema, type) {
    const parts = [type === 'integer' ? 'A whole number' : 'A number'];
    // A bound past what JavaScript counts exactly is the Rust type's own (u64::MAX): unsaid.
    const said = (bound) => (bound !== undefined && Math.abs(bound) <= Number.MAX_SAFE_INTEGER ? bound : undefined);
    const min = said(schema.minimum ?? schema.exclusiveMinimum);
    const max = said(schema.maximum ?? schema.exclusiveMaximum);
    const minText = schema.exclusiveMinimum !== undefined ? `above ${min}` : `at least ${min}`;
    const maxText = schema.exclusiveMaximum !== undefined ? `below ${max}` : `at most ${max}`;
    if (min !== undefined && max !== undefined) parts.push(`${minText} and ${maxText}`);
    else if (min !== undefined) parts.push(minText);
    else if (max !== undefined) parts.push(maxText);
    return `${parts.join(', ')}.`;
  }

  function bounds(schema, unit) {
    const min = schema.minLength ?? schema.minItems;
    const max = schema.maxLength ?? schema.maxItems;
    if (min !== undefined && max !== undefined) return `${min} to ${max} ${unit}.`;
    if (min) return `At least ${min} ${unit}.`;
    if (max !== undefined) return `At most ${max} ${unit}.`;
    return null;
  }

  function clearFieldErrors(form) {
    for (const error of form.querySelectorAll('.field-error')) error.remove();
    for (const invalid of form.querySelectorAll('[aria-invalid]')) {
      invalid.removeAttribute('aria-invalid');
      const describedBy = (invalid.getAttribute('aria-describedby') || '').split(' ').filter((id) => !id.endsWith('-error'));
      invalid.setAttribute('aria-describedby', describedBy.join(' '));
    }
  }

  /**
   * Puts a violation next to its field: by its JSON pointer, or for a missing required
   * property (reported on the object) next to each property the call left out.
   */
  function placeFieldError(form, root, args, violation) {
    if (!form || !root) return false;
    let targets = [violation.path];
    if (violation.keyword === 'required') {
      const schema = root.schemaAt(violation.path);
      const sent = violation.path
        .split('/')
        .slice(1)
        .reduce((node, key) => (node && typeof node === 'object' ? node[key.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined), args);
      targets = (schema.required || [])
        .filter((name) => !sent || typeof sent !== 'object' || !(name in sent))
        .map((name) => `${violation.path}/${name.replace(/~/g, '~0').replace(/\//g, '~1')}`);
    }
    let placed = false;
    for (const target of targets) {
      const box = root.fieldAt(target);
      if (!box) continue;
      const control = box.querySelector('input, select, textarea');
      const error = h('p', { class: 'field-error', id: nextId('error') + '-error', text: violation.message });
      if (box.tagName === 'FIELDSET') box.insertBefore(error, box.children[1] || null);
      else box.append(error);
      if (control && box.tagName !== 'FIELDSET') {
        control.setAttribute('aria-invalid', 'true');
        control.setAttribute('aria-describedby', `${control.getAttribute('aria-describedby') || ''} ${error.id}`.trim());
      }
      placed = true;
    }
    return placed;
  }

  // ---- Executions ------------------------------------------------------------------------

  function executionsView() {
    const status = h(
      'select',
      { id: nextId('status') },
      h('option', { value: '', text: 'any' }),
      ['running', 'completed', 'failed', 'cancelled', 'timed_out'].map((value) => h('option', { value, text: value.replace('_', ' ') })),
    );
    const tool = h('select', { id: nextId('tool') }, h('option', { value: '', text: 'any' }), state.tools.map((entry) => h('option', { value: entry.name, text: entry.name })));
    const body = h('tbody');
    const more = h('button', { type: 'button', text: 'More', hidden: true });
    const note = h('p', { class: 'muted small', 'aria-live': 'polite' });
    const watch = h('div', { class: 'outcome' });
    let cursor = null;

    const load = async (append) => {
      const query = new URLSearchParams({ limit: '20' });
      if (status.value) query.set('status', status.value);
      if (tool.value) query.set('tool', tool.value);
      if (append && cursor) query.set('cursor', cursor);
      const { response, body: page } = await getJson(`${state.discovery.executions_url}?${query}`);
      if (!response.ok || !page) {
        const error = errorOf(response, page);
        note.textContent = `${error.code}: ${error.message}`;
        return;
      }
      cursor = page.next_cursor || null;
      more.hidden = !cursor;
      const rows = page.executions.map((execution) => executionRow(execution, watch, () => load(false)));
      if (append) body.append(...rows);
      else body.replaceChildren(...rows);
      note.textContent = body.children.length
        ? ''
        : state.token
          ? 'No executions yet. Runs in the background, and runs with a request id, are kept here.'
          : 'Executions are kept for identified callers: enter a token to see yours.';
    };
    status.addEventListener('change', () => load(false));
    tool.addEventListener('change', () => load(false));
    more.addEventListener('click', () => load(true));
    load(false);
    return h(
      'section',
      { class: 'card' },
      h('h2', { text: 'Executions' }),
      h('p', { class: 'muted', text: 'This caller\u2019s recent executions, newest first.' }),
      h(
        'div',
        { class: 'toolbar' },
        h('div', { class: 'field' }, h('label', { for: status.id, text: 'Status' }), status),
        h('div', { class: 'field' }, h('label', { for: tool.id, text: 'Tool' }), tool),
        h('button', { type: 'button', text: 'Refresh', onclick: () => load(false) }),
      ),
      h(
        'div',
        { class: 'table-wrap' },
        h('table', null, h('thead', null, h('tr', null, ['Execution', 'Tool', 'Status', 'Created', ''].map((title) => h('th', { scope: 'col', text: title })))), body),
      ),
      note,
      more,
      watch,
    );
  }

  function executionRow(execution, watch, reload) {
    const kind = execution.status === 'completed' ? 'ok' : execution.status === 'running' ? 'info' : 'bad';
    const show = h('button', { type: 'button', class: 'link', text: execution.status === 'running' ? 'Watch' : 'Show' });
    show.setAttribute('aria-label', `${show.textContent} ${execution.execution_id}`);
    show.addEventListener('click', () => {
      if (state.running) state.running.abort();
      const live = runningCard(execution.tool);
      const result = h('div');
      watch.replaceChildren(h('h3', null, 'Execution ', code(execution.execution_id)), live.card, result);
      watchExecution(execution.execution_id, live, result, null).then(reload);
    });
    const actions = [show];
    if (execution.status === 'running') {
      const cancel = h('button', { type: 'button', class: 'link', text: 'Cancel', 'aria-label': `Cancel ${execution.execution_id}` });
      cancel.addEventListener('click', () => cancelExecution(execution.execution_id, cancel));
      actions.push(cancel);
    }
    return h(
      'tr',
      null,
      h('td', null, code(execution.execution_id)),
      h('td', null, code(execution.tool)),
      h('td', null, badge(execution.status.replace('_', ' '), kind)),
      h('td', { text: new Date(execution.created_at).toLocaleString() }),
      h('td', null, actions),
    );
  }

  // ---- Health ----------------------------------------------------------------------------

  const HEALTH_KIND = { pass: 'ok', warn: 'warn', fail: 'bad' };

  async function fetchHealth() {
    if (!state.discovery || !state.discovery.health_url) return null;
    try {
      const { body } = await getJson(state.discovery.health_url);
      return body && body.status ? body : null;
    } catch {
      return null;
    }
  }

  async function refreshHealth() {
    const health = await fetchHealth();
    const link = $('#health-badge');
    link.hidden = !health;
    if (!health) return;
    link.replaceChildren(badge(health.state, HEALTH_KIND[health.status]));
    link.setAttribute('aria-label', `Health: ${health.state}`);
  }

  function healthView() {
    const box = h('div', null, h('p', { class: 'muted', text: 'Loading…' }));
    const load = async () => {
      const health = await fetchHealth();
      refreshHealth();
      if (!health) {
        box.replaceChildren(h('p', { text: 'The health report could not be read.' }));
        return;
      }
      box.replaceChildren(
        h('p', null, badge(health.state, HEALTH_KIND[health.status]), ` since ${new Date(health.since).toLocaleString()}`),
        health.reason ? h('p', { text: health.reason }) : null,
        h(
          'div',
          { class: 'table-wrap' },
          h(
            'table',
            null,
            h('thead', null, h('tr', null, ['Check', 'Status', 'Observed', 'Output'].map((title) => h('th', { scope: 'col', text: title })))),
            h(
              'tbody',
              null,
              Object.entries(health.checks || {}).map(([name, check]) =>
                h(
                  'tr',
                  null,
                  h('td', null, code(name)),
                  h('td', null, badge(check.status, HEALTH_KIND[check.status])),
                  h('td', { text: check.observed_ms !== undefined ? `${check.observed_ms} ms` : '' }),
                  h('td', { text: check.output || '' }),
                ),
              ),
            ),
          ),
        ),
      );
    };
    load();
    return h(
      'section',
      { class: 'card' },
      h('h2', { text: 'Health' }),
      box,
      h('div', { class: 'actions' }, h('button', { type: 'button', text: 'Refresh', onclick: load })),
    );
  }

  // ---- Event subscriptions (internal callers) -------------------------------------------

  function eventsView() {
    const url = '/agent/events/subscriptions';
    const list = h('tbody');
    const note = h('p', { class: 'muted small', 'aria-live': 'polite' });
    const detail = h('div', { class: 'outcome' });
    const endpoint = h('input', { id: nextId('url'), type: 'url', placeholder: 'https://example.com/webhooks', spellcheck: 'false' });
    const description = h('input', { id: nextId('description') });
    const types = EVENT_TYPES.map((type) => ({ type, box: h('input', { type: 'checkbox', id: nextId('type'), checked: type === 'execution.finished' }) }));
    const created = h('div', { class: 'outcome', 'aria-live': 'polite' });

    const load = async () => {
      const { response, body } = await getJson(url);
      if (!response.ok || !body) {
        note.textContent = errorOf(response, body).message;
        return;
      }
      list.replaceChildren(...body.subscriptions.map((subscription) => subscriptionRow(subscription, detail, load)));
      note.textContent = body.subscriptions.length ? '' : 'No subscriptions yet.';
    };

    const form = h('form', { novalidate: true, 'aria-label': 'New subscription' });
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const request = { url: endpoint.value, event_types: types.filter((entry) => entry.box.checked).map((entry) => entry.type) };
      if (description.value) request.description = description.value;
      const { response, body } = await sendJson('POST', url, request);
      if (response.status === 201 && body) {
        created.replaceChildren(secretCard('Subscribed', body));
        endpoint.value = '';
        description.value = '';
        load();
      } else {
        const error = errorOf(response, body);
        created.replaceChildren(resultCard('bad', error.code, [h('p', { text: error.message })]));
      }
    });
    form.append(
      h('div', { class: 'fields' },
        h('div', { class: 'field' }, h('label', { for: endpoint.id, text: 'url' }), endpoint, h('p', { class: 'help', text: 'An https:// receiver on a public address (the SSRF guard refuses others).' })),
        h('div', { class: 'field' }, h('div', { class: 'label-row' }, h('label', { for: description.id, text: 'description' }), h('span', { class: 'optional', text: 'optional' })), description),
        h('fieldset', { class: 'field' }, h('legend', { text: 'event_types' }), h('div', { class: 'types' }, types.map((entry) => h('label', null, entry.box, entry.type)))),
      ),
      h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', text: 'Subscribe' })),
    );
    load();
    return h(
      'section',
      { class: 'card' },
      h('h2', { text: 'Event subscriptions' }),
      h('p', { class: 'muted', text: 'Signed webhooks (Standard Webhooks). Each secret is shown once, when it is made.' }),
      h('div', { class: 'table-wrap' }, h('table', null, h('thead', null, h('tr', null, ['URL', 'Events', 'Status', ''].map((title) => h('th', { scope: 'col', text: title })))), list)),
      note,
      detail,
      h('h3', { text: 'New subscription' }),
      form,
      created,
    );
  }

  function secretCard(title, subscription) {
    const secret = h('input', { class: 'secret', readonly: true, value: subscription.secret, id: nextId('secret') });
    return resultCard('ok', title, [
      h('p', null, code(subscription.id), ' → ', code(subscription.url)),
      h('div', { class: 'field' }, h('label', { for: secret.id, text: 'Signing secret (shown once)' }), secret),
    ]);
  }

  function subscriptionRow(subscription, detail, reload) {
    const base = `/agent/events/subscriptions/${encodeURIComponent(subscription.id)}`;
    const deliveries = h('button', { type: 'button', class: 'link', text: 'Deliveries', 'aria-label': `Deliveries to ${subscription.url}` });
    deliveries.addEventListener('click', async () => {
      const { response, body } = await getJson(`${base}/deliveries`);
      if (!response.ok || !body) {
        detail.replaceChildren(resultCard('bad', 'Deliveries', [h('p', { text: errorOf(response, body).message })]));
        return;
      }
      detail.replaceChildren(
        h('h3', null, 'Deliveries to ', code(subscription.url)),
        body.deliveries.length
          ? h(
              'div',
              { class: 'table-wrap' },
              h(
                'table',
                null,
                h('thead', null, h('tr', null, ['Event', 'At', 'Status', 'Duration', 'Error'].map((title) => h('th', { scope: 'col', text: title })))),
                h('tbody', null, body.deliveries.map((attempt) =>
                  h('tr', null,
                    h('td', null, code(attempt.event_id)),
                    h('td', { text: new Date(attempt.at).toLocaleString() }),
                    h('td', { text: attempt.status_code ?? '' }),
                    h('td', { text: `${attempt.duration_ms} ms` }),
                    h('td', { text: attempt.error || '' })))),
              ),
            )
          : h('p', { class: 'muted', text: 'No attempts yet.' }),
      );
    });
    const actions = [deliveries];
    if (subscription.source !== 'config') {
      const rotate = h('button', { type: 'button', class: 'link', text: 'Rotate secret', 'aria-label': `Rotate the secret of ${subscription.url}` });
      rotate.addEventListener('click', async () => {
        const { response, body } = await sendJson('POST', `${base}/rotate-secret`);
        detail.replaceChildren(response.ok && body ? secretCard('Secret rotated: the old one signs alongside for 24 h', body) : resultCard('bad', 'Not rotated', [h('p', { text: errorOf(response, body).message })]));
      });
      const remove = h('button', { type: 'button', class: 'link', text: 'Delete', 'aria-label': `Delete the subscription of ${subscription.url}` });
      remove.addEventListener('click', async () => {
        if (remove.dataset.armed !== 'yes') {
          remove.dataset.armed = 'yes';
          remove.textContent = 'Really delete?';
          return;
        }
        await sendJson('DELETE', base);
        reload();
      });
      actions.push(rotate, remove);
    }
    return h(
      'tr',
      null,
      h('td', null, code(subscription.url), subscription.description ? h('div', { class: 'small muted', text: subscription.description }) : null),
      h('td', null, subscription.event_types.map((type) => h('div', null, code(type)))),
      h('td', null, badge(subscription.status, subscription.status === 'enabled' ? 'ok' : 'bad'), subscription.source === 'config' ? h('div', { class: 'small muted', text: 'from carmy.toml' }) : null),
      h('td', null, actions),
    );
  }

  // ---- Start -----------------------------------------------------------------------------

  function start() {
    const tokenInput = $('#token');
    tokenInput.value = state.token;
    $('#token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      state.token = tokenInput.value.trim();
      if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
      else sessionStorage.removeItem(TOKEN_KEY);
      load();
    });
    $('#token-clear').addEventListener('click', () => {
      tokenInput.value = '';
      state.token = '';
      sessionStorage.removeItem(TOKEN_KEY);
      load();
      tokenInput.focus();
    });
    $('#search').addEventListener('input', renderToolList);
    window.addEventListener('hashchange', () => {
      route();
      $('#main').focus({ preventScroll: true });
    });
    setInterval(refreshHealth, 15000);
    load();
  }

  start();
})();
