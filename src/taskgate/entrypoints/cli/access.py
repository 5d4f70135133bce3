"""Who may do what: tokens, operators, policies."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.application.operators.roster import AddOperator
from taskgate.domain.access import Capability, Principal
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import (
    JsonOpt,
    ProjectOpt,
    _local_actor,
    _operator_actor,
    emit,
    fail,
    operator_app,
    policies_app,
    run,
    say,
    token_app,
)
from taskgate.entrypoints.render import console

if TYPE_CHECKING:
    from taskgate.bootstrap import App


@token_app.command("create")
def token_create(
    operator: Annotated[str | None, typer.Option("--operator", help="An operator token for this operator id.")] = None,
    agent: Annotated[bool, typer.Option("--agent", help="An agent token, scoped to --session.")] = False,
    session: Annotated[str | None, typer.Option("--session", help="The session an agent token reaches.")] = None,
    label: Annotated[str, typer.Option("--label", help="A note to recognise the token by.")] = "",
    config_entry: Annotated[
        bool,
        typer.Option(
            "--config-entry",
            help="Store nothing: print the token and a [[mcp.tokens]] entry (its hash) for the config.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Issue a bearer token. It is shown once; only its hash is stored (in the database, or in your config)."""
    if agent == (operator is not None) or (agent and not session) or (session and not agent):
        fail("give either --operator ID, or --agent --session ID")
    if config_entry:
        _print_config_entry(operator, session, label)
        return

    async def work(services: App):
        await _as_admin(services)
        if agent:
            assert session is not None
            return await services.access.create_agent_token(await services.sessions.resolve_id(session), label)
        assert operator is not None
        return await services.access.create_operator_token(operator, label)

    issued = run(work)
    if as_json:
        render.print_json({**render.jsonable(issued.token), "token_hash": None, "token": issued.secret})
        return
    console.print(f"token {issued.token.id} ({issued.token.kind}) created; it is shown only this once:")
    print(issued.secret)


def _print_config_entry(operator: str | None, session: str | None, label: str) -> None:
    from taskgate.application.operators.access import AccessService

    secret, digest = AccessService.new_secret()
    owner = f'operator = "{operator}"' if operator else f'session = "{session}"'
    console.print("the token (shown only this once; give it to the client):", highlight=False)
    print(secret)
    console.print("add this to config/taskgate.toml (it holds only the hash):", highlight=False)
    say(f'[[mcp.tokens]]\n{owner}\nsha256 = "{digest}"\nlabel = "{label}"')


@token_app.command("list")
def token_list(as_json: JsonOpt = False) -> None:
    """List issued tokens (never their secrets)."""
    tokens = run(lambda services: services.access.list_tokens())
    rows = (
        [
            t.id,
            t.kind,
            t.operator_id or "",
            t.session_id or "",
            t.label,
            t.created_at.isoformat(timespec="seconds"),
            "revoked" if t.revoked_at else "active",
        ]
        for t in tokens
    )
    emit(
        [{**render.jsonable(t), "token_hash": None} for t in tokens],
        as_json,
        lambda: render.table(
            "Tokens", ["id", "kind", "operator", "session", "label", "created", "status"], rows, markup=False
        ),
    )


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(help="The token id (see token list).")]) -> None:
    """Revoke a token: it stops working at once."""

    async def work(services: App):
        await _as_admin(services)
        return await services.access.revoke(token_id)

    token = run(work)
    console.print(f"token {token.id} revoked")


@policies_app.command("list")
def policies_list(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """The policies of a project (with -p; else the only project's, or the global set): priority, severity,
    triggers, enabled, settings."""

    async def work(services: App):
        name = (await services.tracker.resolve_project(project, os.getcwd())).name if project else None
        if name is None:
            projects = [p for p in await services.tracker.list_projects() if p.archived_at is None]
            name = projects[0].name if len(projects) == 1 else None
        return name, services.sessions.policies(name), services.sessions.test_command(name)

    name, entries, command = run(work)
    if as_json:
        render.print_json({"project": name, "test_command": list(command), "policies": [e.as_dict() for e in entries]})
        return
    console.print(render.policies_table(name, entries, command))


@policies_app.command("check")
def policies_check(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    trigger: Annotated[str, typer.Argument(help="The trigger to dry-run, e.g. approve, merge, start.")],
    run_tests: Annotated[
        bool, typer.Option("--run-tests/--no-run-tests", help="Run require_tests' command if no stored run fits.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Dry run: what firing TRIGGER on the session now would meet, policy by policy. Writes nothing.
    Exits 0 when the trigger would be allowed, 2 when a policy would refuse it."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        return await services.sessions.check(full_id, trigger, actor=_local_actor(services), run_tests=run_tests)

    check = run(work)
    if as_json:
        render.print_json(render.policy_check_data(check))
    else:
        render.print_policy_check(check)
    if not check.allowed:
        raise typer.Exit(2)


RoleOpt = Annotated[list[str] | None, typer.Option("--role", help="architect, developer, reviewer, qa or admin.")]
PermissionOpt = Annotated[
    list[str] | None, typer.Option("--permission", help="An extra permission: read, write, approve, override, admin.")
]


async def _as_admin(services: App) -> str:
    """The local operator, refused unless it may administer operators."""
    operator_id, actor = _operator_actor(services, None)
    await services.operators.authorize(Principal.operator(operator_id), Capability.ADMINISTER)
    return actor


@operator_app.command("add")
def operator_add(
    operator_id: Annotated[str, typer.Argument()],
    role: RoleOpt = None,
    name: Annotated[str | None, typer.Option()] = None,
    email: Annotated[str | None, typer.Option()] = None,
    max_active: Annotated[int, typer.Option("--max-active", help="Sessions it may have in progress.")] = 5,
    permission: PermissionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add an operator with roles (default: developer)."""

    async def work(services: App):
        actor = await _as_admin(services)
        cmd = AddOperator(operator_id, role or ["developer"], name, email, max_active, permission or [], actor)
        return await services.operators.add(cmd)

    operator = run(work)
    emit(operator, as_json, lambda: render.operators_table([operator]))


@operator_app.command("grant")
def operator_grant(
    operator_id: Annotated[str, typer.Argument()],
    role: RoleOpt = None,
    permission: PermissionOpt = None,
    max_active: Annotated[int | None, typer.Option("--max-active")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Give an operator more roles or permissions, or another capacity."""
    if not (role or permission or max_active):
        fail("nothing to grant: pass --role, --permission or --max-active")

    async def work(services: App):
        actor = await _as_admin(services)
        return await services.operators.grant(
            operator_id, roles=role or [], permissions=permission or [], max_active_sessions=max_active, actor=actor
        )

    operator = run(work)
    emit(operator, as_json, lambda: render.operators_table([operator]))


@operator_app.command("list")
def operator_list(as_json: JsonOpt = False) -> None:
    """Operators with their roles, effective permissions and capacity."""
    operators = run(lambda services: services.operators.list())
    emit(operators, as_json, lambda: render.operators_table(operators))
